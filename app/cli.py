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
from localchat.engine.errors import ContextLengthError

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
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "stop": "--stop",
}
# Reply room reserved when fitting a conversation into the context: the request's max_tokens
# (SamplingParams' default when --max-tokens is not given), or this when max_tokens is None
# (run to the context end); never more than half the context (see ``fit_prompt``).
DEFAULT_REPLY_RESERVE = 512


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
    min_p: Annotated[
        float | None,
        typer.Option(
            "--min-p", help="Drop tokens below min_p x the top probability; [0, 1].",
            show_default="0",
        ),
    ] = None,
    repetition_penalty: Annotated[
        float | None,
        typer.Option(
            "--repetition-penalty",
            help="Penalize tokens already in the prompt or reply; (0, 100], 1 disables.",
            show_default="1.0",
        ),
    ] = None,
    presence_penalty: Annotated[
        float | None,
        typer.Option(
            "--presence-penalty", help="Penalize tokens already in the reply; [-2, 2].",
            show_default="0",
        ),
    ] = None,
    frequency_penalty: Annotated[
        float | None,
        typer.Option(
            "--frequency-penalty",
            help="Penalize tokens by their count in the reply; [-2, 2].",
            show_default="0",
        ),
    ] = None,
    stop: Annotated[
        list[str] | None,
        typer.Option(
            "--stop",
            help="Stop the reply at this text (not printed); repeat for several.",
            show_default=False,
        ),
    ] = None,
    no_stream: Annotated[
        bool,
        typer.Option("--no-stream", help="Print the whole answer at the end instead of streaming."),
    ] = False,
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
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "stop": tuple(stop) if stop else None,
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
    prompt_ids = fit_prompt(session, engine.tokenizer, engine.max_model_len, sampling.max_tokens)
    _stream_answer(engine, prompt_ids, sampling, stream=not no_stream)


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


def fit_prompt(session: Any, tokenizer: Any, max_model_len: int, max_tokens: int | None
               ) -> list[int]:
    """Render ``session`` into prompt ids that leave room for the reply in the context.

    The rule: ``max_prompt_tokens = max_model_len - min(max_tokens or 512, max_model_len // 2)``.
    Older turns are dropped whole to fit it (``ChatSession.to_prompt_token_ids``), with one
    ``localchat: note:`` line on stderr saying how many. When the system prompt plus the latest
    message alone exceed it but still fit the context (``< max_model_len``), they are sent as
    they are and the engine caps the reply to the room left (``LLMEngine.add_request``); only a
    prompt that leaves no room at all is a ``ContextLengthError`` (exit 1). Template notices
    (a system prompt folded into the first user turn) are printed as notes too.
    """
    import warnings

    from localchat.engine.tokenizer import SystemPromptFoldedWarning

    reserve = min(max_tokens or DEFAULT_REPLY_RESERVE, max_model_len // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ids = session.to_prompt_token_ids(tokenizer, max_model_len - reserve)
        except ContextLengthError:
            try:
                ids = session.to_prompt_token_ids(tokenizer, max_model_len - 1)
            except ContextLengthError as err:
                raise ContextLengthError(
                    f"{err} (the context holds {max_model_len} tokens, prompt + reply)"
                ) from None
    notes = dict.fromkeys(
        cli_io.one_line(str(w.message)) for w in caught
        if issubclass(w.category, SystemPromptFoldedWarning)
    )
    for note in notes:
        cli_io.note(note)
    dropped = session.last_dropped_turns
    if dropped:
        turns = "turn" if dropped == 1 else "turns"
        cli_io.note(f"dropped {dropped} earlier {turns} to fit the context ({max_model_len} tokens)")
    return ids


def _stream_answer(engine: Any, prompt_ids: list[int], sampling: Any, *, stream: bool = True
                   ) -> None:
    """Stream the reply to stdout (or print it whole at the end when not ``stream``); Ctrl+C
    keeps what was generated and exits 130."""
    writer = cli_io.AnswerWriter(buffered=not stream)
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
