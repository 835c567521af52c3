"""``localchat history``: list, show, search, export and delete stored conversations.

A typer sub-application over ``store.Store`` (the same database ``ask -c`` and the TUI use);
``check`` and ``repair`` (``store_repair``) deal with a damaged file. A history that cannot be
used is one ``localchat: error:`` line naming the file and what to do (exit 1).
Plain text when stdout is not a terminal (tables as aligned columns, no ANSI); Rich on a
terminal. ``list``, ``show`` and ``search`` print stored control characters as ``\\xNN``
escapes (text from a model or a paste must not drive the terminal); ``export`` keeps them.
Unknown ids are one-line errors (exit 1), an empty id a usage error (exit 2); ids may be
given as a unique prefix.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from localchat.app import cli_io
from localchat.app.cli_io import DebugOpt
from localchat.engine.errors import LocalchatError

history_app = typer.Typer(
    name="history", help="Browse the conversation history (shared by ask and the TUI).",
    no_args_is_help=True, add_completion=False,
)
IdArg = Annotated[str, typer.Argument(help="Conversation id (or a unique prefix of it).")]


def _store():
    from localchat.app.store import Store

    return Store()


def _check_ids(command: str, ids: list[str]) -> None:
    """An empty (or blank) conversation id is a usage error (exit 2), found before the history
    file is opened, like a missing one; a non-empty id that matches nothing stays exit 1.

    Raises:
        CliUsageError: one of ``ids`` is empty or whitespace only.
    """
    if any(not cid.strip() for cid in ids):
        raise cli_io.CliUsageError(f"history {command}: a conversation id cannot be empty "
                                   "(see 'localchat history list')")


@history_app.command("list")
def list_(
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, help="Most rows to show.")] = 50,
    debug: DebugOpt = False,
) -> None:
    """List conversations, most recent first: id, last update, messages, model, title."""
    from localchat.app.history_format import local_time

    with _store() as store:
        convs = store.list_conversations(limit=limit)
    rows = [(c.id, local_time(c.updated), str(c.message_count),
             cli_io.printable(c.model or "—"), cli_io.printable(c.title or "—")) for c in convs]
    print_table(("ID", "UPDATED", "MSGS", "MODEL", "TITLE"), rows)


@history_app.command()
def show(conversation: IdArg, debug: DebugOpt = False) -> None:
    """Print a conversation (Markdown; rendered on a terminal)."""
    _check_ids("show", [conversation])
    with _store() as store:
        text = cli_io.printable(store.export_markdown(conversation), keep="\n\t")
    if cli_io.stream_isatty(sys.stdout):
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        sys.stdout.write(text)


@history_app.command()
def search(
    query: Annotated[list[str], typer.Argument(help="Words to find (all of them).")],
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, help="Most hits.")] = 50,
    debug: DebugOpt = False,
) -> None:
    """Find messages containing every word: one line per hit (id, role, snippet)."""
    import warnings

    if not any(word.strip() for word in query):
        raise cli_io.CliUsageError("history search: give at least one word to find")

    with _store() as store, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once below, as a localchat warning line
        if not store.fts:
            cli_io.warn("this SQLite has no FTS5; searching by substring")
        hits = store.search(" ".join(query), limit=limit)
    if not hits:
        cli_io.note("no message matches")
        return
    tty = cli_io.stream_isatty(sys.stdout)
    rows = []
    for hit in hits:
        snippet = cli_io.printable(cli_io.one_line(hit.snippet), keep="\x02\x03")
        if not tty:
            snippet = snippet.replace("\x02", "").replace("\x03", "")
        rows.append((hit.conversation_id, hit.role, snippet))
    if tty:
        from rich.console import Console
        from rich.markup import escape

        console = Console(highlight=False)
        for cid, role, snippet in rows:
            marked = escape(snippet).replace("\x02", "[bold reverse]").replace("\x03", "[/]")
            console.print(f"[cyan]{cid}[/]  [dim]{role:<9}[/]  {marked}")
    else:
        for cid, role, snippet in rows:
            typer.echo(f"{cid}  {role:<9}  {snippet}")


@history_app.command()
def export(
    conversation: IdArg,
    fmt: Annotated[str, typer.Option("-f", "--format", help="md or json.")] = "md",
    debug: DebugOpt = False,
) -> None:
    """Write a conversation to stdout as Markdown or JSON."""
    if fmt not in ("md", "json"):
        raise cli_io.CliUsageError(f"--format must be md or json, got {fmt!r}")
    _check_ids("export", [conversation])
    with _store() as store:
        text = store.export_json(conversation) if fmt == "json" else \
            store.export_markdown(conversation)
    sys.stdout.write(text)


@history_app.command("rm")
def rm(conversations: Annotated[list[str], typer.Argument(help="Conversation ids.")],
       debug: DebugOpt = False) -> None:
    """Delete conversations and their messages."""
    _check_ids("rm", conversations)
    with _store() as store:
        ids = [store.resolve_id(c) for c in conversations]  # all valid before deleting any
        for cid in dict.fromkeys(ids):
            store.delete_conversation(cid)
            cli_io.note(f"deleted conversation {cid}")


@history_app.command()
def check(debug: DebugOpt = False) -> None:
    """Run SQLite's integrity check on the history file: 'ok', or the problems (exit 1)."""
    from localchat.app import store_repair
    from localchat.app.store import default_path

    path = default_path()
    if not path.exists():  # nothing written yet: nothing wrong either (repair has no file)
        typer.echo(f"{path}: no history yet (nothing to check)")
        return
    if not path.is_file():  # a folder or the like: repair cannot help, say what it is
        typer.echo(f"{path}: not a file; move it aside and the next turn starts a new history")
        raise typer.Exit(cli_io.EXIT_RUNTIME)
    problems = store_repair.check(path)
    if not problems:
        typer.echo(f"{path}: ok")
        return
    for problem in problems:
        typer.echo(f"{path}: {cli_io.one_line(problem)}")
    cli_io.note("run 'localchat history repair' to salvage what is readable into a new file")
    raise typer.Exit(cli_io.EXIT_RUNTIME)


@history_app.command()
def repair(
    force: Annotated[bool, typer.Option("--force", help="Rebuild a file that passes the "
                                        "integrity check too.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Copy every readable conversation into a new history file and put it in place; the
    damaged file is kept beside it as history.db.corrupt-<time>."""
    from localchat.app import store_repair
    from localchat.app.store import default_path

    path = default_path()
    if not path.is_file():
        raise cli_io.CliUsageError(f"there is no history file at {path}")
    if not force and not store_repair.check(path):
        cli_io.note(f"{path} passes SQLite's integrity check: nothing to repair (--force "
                    "rebuilds it anyway)")
        return
    result = store_repair.repair(path)
    if not (result.conversations or result.messages or result.lost_conversations
            or result.lost_messages):  # not even the row count could be read
        raise LocalchatError(
            f"nothing could be salvaged from {path}: its tables cannot be read; a new empty "
            f"history is in place, and the old file is {result.moved_aside} (keep it: "
            "'sqlite3 FILE .recover' may get more out of it)")
    lost = ""
    if result.lost_conversations or result.lost_messages:
        lost = (f"; lost {result.lost_conversations} conversation and "
                f"{result.lost_messages} message row(s)")
    cli_io.note(f"salvaged {result.conversations} conversations and {result.messages} messages "
                f"into {result.new_path}{lost}; the old file is {result.moved_aside}")


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table on stdout: Rich on a terminal, else aligned plain columns (last one free)."""
    if cli_io.stream_isatty(sys.stdout):
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name in header:
            table.add_column(name, no_wrap=name != header[-1], overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
        typer.echo("  ".join(cells).rstrip())
