"""The ``localchat`` command line: ``ask``, ``pull``, ``models``.

A thin shell over the engine (DESIGN.md section 2): parse flags, build ``SamplingParams``,
resolve the model, delegate. torch and transformers are imported inside the commands, so
``localchat --help`` and usage errors stay fast. Exit codes and error lines follow DESIGN.md
section 9 (see ``cli_io.run_cli``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated, Any

import typer

from localchat.app import cli_io
from localchat.app.cli_io import CliUsageError

app = typer.Typer(
    name="localchat",
    help="A terminal chat app and local assistant with its own LLM inference engine.",
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show the full traceback on errors.", show_default=False)
]
# SamplingParams field -> the flag that sets it (used to name the flag in range errors).
SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
}


@app.callback()
def _root(ctx: typer.Context, debug: DebugOpt = False) -> None:
    """localchat: chat with local LLMs run by localchat's own engine.

    Try: localchat ask "What is the capital of France?"
    """
    if ctx.invoked_subcommand is None:
        # The TUI takes this place in its own issue; until then, show the help.
        typer.echo(ctx.get_help())
        raise typer.Exit(cli_io.EXIT_OK)


@app.command()
def ask(
    prompt: Annotated[
        str | None,
        typer.Argument(
            help="The question. Text piped on stdin comes first, then a blank line, then PROMPT.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--model",
            help="Catalog alias, Hub repo id, HF folder or .gguf file.",
            show_default="settings' default_model, smollm2-135m",
        ),
    ] = None,
    system: Annotated[str | None, typer.Option("-s", "--system", help="System prompt.")] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", help="Most tokens to generate (>= 1).", show_default="512"),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="0 is greedy; range [0, 100].", show_default="0.7"),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option("--top-p", help="Nucleus mass in (0, 1].", show_default="1.0"),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k", help="Keep the k most likely tokens; 0 keeps all.", show_default="0"
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Random seed for reproducible sampling.", show_default=False),
    ] = None,
    no_stdin: Annotated[
        bool, typer.Option("--no-stdin", help="Ignore stdin even when it is piped.")
    ] = False,
    debug: DebugOpt = False,
) -> None:
    """Answer one prompt, streaming the reply to stdout."""
    from localchat.engine.sampling_params import SamplingParams

    knobs = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "max_tokens": max_tokens,
    }
    try:
        sampling = SamplingParams(**{k: v for k, v in knobs.items() if v is not None})
    except ValueError as e:
        raise CliUsageError(cli_io.sampling_error_message(e, SAMPLING_FLAGS)) from None

    text = cli_io.build_prompt(prompt, "" if no_stdin else cli_io.read_stdin())
    spec = model or _default_model()
    engine = cli_io.guarded(lambda: _load_engine(spec))

    from localchat.app.session import ChatSession

    session = ChatSession(system=system)
    session.add_user(text)
    prompt_ids = session.to_prompt_token_ids(engine.tokenizer)
    _stream_answer(engine, prompt_ids, sampling)


@app.command()
def pull(
    model: Annotated[str, typer.Argument(help="Catalog alias, Hub repo id, or local path.")],
    debug: DebugOpt = False,
) -> None:
    """Download a model into the cache (progress on stderr) and print its local path."""
    source = cli_io.guarded(lambda: _resolve(model))
    typer.echo(str(source.path))


@app.command()
def models(debug: DebugOpt = False) -> None:
    """List the catalog models: alias, source, size, cached, local path."""
    from localchat.app.settings import cache_dir
    from localchat.engine.hub import list_models

    rows = [_model_row(info) for info in list_models(cache_dir())]
    header = ("ALIAS", "SOURCE", "SIZE", "CACHED", "PATH")
    if cli_io.stream_isatty(sys.stdout):
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name in header:  # short columns stay whole; long ones fold, never truncated
            short = name in ("ALIAS", "SIZE", "CACHED")
            table.add_column(name, no_wrap=short, overflow="fold", min_width=None if short else 12)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        for row in [header, *rows]:
            cells = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
            typer.echo("  ".join(cells).rstrip())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with its code."""
    code = cli_io.run_cli(typer.main.get_command(app), argv)
    sys.exit(code)


# --- helpers -------------------------------------------------------------------------------


def _default_model() -> str:
    """The model to use when ``--model`` is not given: the settings' ``default_model``."""
    from localchat.app.settings import load_settings

    return load_settings().default_model


def _resolve(spec: str) -> Any:
    """Resolve a model spec to a local ``ModelSource``, downloading with progress on stderr."""
    from localchat.app.settings import cache_dir
    from localchat.engine.hub import resolve_model

    return resolve_model(
        spec, cache_dir=cache_dir(), download=True, progress=cli_io.stderr_progress
    )


def _load_engine(spec: str) -> Any:
    """Resolve ``spec`` and load an ``LLMEngine`` on it (notice on stderr when a terminal)."""
    source = _resolve(spec)
    cli_io.notice(f"loading {source.alias or spec} ...")
    from localchat.app.settings import cache_dir
    from localchat.engine.llm_engine import LLMEngine

    return LLMEngine.from_source(source, cache_dir=cache_dir())


def _stream_answer(engine: Any, prompt_ids: list[int], sampling: Any) -> None:
    """Stream the reply to stdout; Ctrl+C keeps what was printed and exits 130."""
    writer = cli_io.AnswerWriter()
    outputs: Any = None
    try:
        outputs = engine.generate(prompt_ids, sampling)
        for out in outputs:
            writer.write(out.text_delta)
            if out.finished:
                break
        writer.finish()
    except KeyboardInterrupt:
        with contextlib.suppress(BrokenPipeError):
            writer.finish()
        _close_quietly(outputs)
        raise typer.Exit(cli_io.EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # the reader went away (`| head`): stop generating, quietly
        _close_quietly(outputs)
        cli_io.silence_stdout()
        raise typer.Exit(cli_io.EXIT_BROKEN_PIPE) from None


def _close_quietly(outputs: Any) -> None:
    """Close a generator (the engine aborts the request); ignore a second Ctrl+C."""
    close = getattr(outputs, "close", None)
    if close is not None:
        with contextlib.suppress(Exception, KeyboardInterrupt):
            close()


def _model_row(info: Any) -> tuple[str, str, str, str, str]:
    """One ``models`` table row from a hub ``ModelInfo``."""
    return (
        info.alias,
        info.source,
        cli_io.human_size(info.size_bytes),
        "✓" if info.cached else "—",
        str(info.path) if info.path else "—",
    )


if __name__ == "__main__":
    main()
