"""The ``localchat`` command line: ``ask``, ``chat``, ``serve``, ``pull``, ``models``, ``plan``,
``history``, ``config``. A thin shell over the engine (README, Architecture): parse flags and
delegate (``ask_cmd``, ``chat_jsonl``, ``serve_cli``, ``history_cli``, ``config_cli``,
``models_cli``, ``plan_cli``). torch and transformers are imported inside the commands, so
``localchat --help`` and usage errors stay fast. Exit codes and error lines follow
``cli_io.run_cli`` (README, Usage).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from localchat.app import cli_io, interrupts
from localchat.app.cache_cli import cache_app
from localchat.app.cli_io import DebugOpt, QuantOpt
from localchat.app.config_cli import config_app
from localchat.app.history_cli import history_app
from localchat.app.load_options import (
    check_jsonl_only,
    check_model_flag,
    check_theme_flag,
    tui_without_a_terminal,
)
from localchat.app.models_cli import models_command, pull_command, rm_command
from localchat.app.plan_cli import plan_command
from localchat.app.serve_cli import serve_command

app = typer.Typer(
    name="localchat",
    help="A terminal chat app and local assistant with its own LLM inference engine.",
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

ContextOpt = Annotated[
    int | None,
    typer.Option("-C", "--context", help="Context size in tokens (prompt + reply); sizes the "
                 "KV cache.", show_default="config 'context', else the model's, at most 8192 "
                 "on CPU"),
]
ThemeOpt = Annotated[str | None, typer.Option(
    "--theme", help="TUI theme: dark, light, high-contrast (or a Textual theme).",
    show_default="settings' theme, dark")]


def _print_version() -> None:
    """``localchat --version``: the installed distribution's version (no torch import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"localchat {version('localchat')}")
    except PackageNotFoundError:  # run from a source tree that was never installed
        typer.echo("localchat (not installed)")
    raise typer.Exit(cli_io.EXIT_OK)


@app.callback()
def _root(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option("-m", "--model", help="Model for the chat TUI (as in ask).",
                     show_default=False),
    ] = None,
    theme: ThemeOpt = None,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="OpenAI-compatible server URL the chat "
                                 "TUI talks to (env LOCALCHAT_ENDPOINT, config 'endpoint').",
                                 show_default=False)
    ] = None,
    debug: DebugOpt = False,
    version: Annotated[
        bool, typer.Option("--version", help="Print localchat's version and exit.",
                           callback=lambda v: _print_version() if v else None, is_eager=True,
                           show_default=False)
    ] = False,
) -> None:
    """localchat: chat with local LLMs run by localchat's own engine.

    With no command, opens the chat TUI (on a terminal; otherwise prints this help).
    Try: localchat ask "What is the capital of France?"
    """
    if ctx.invoked_subcommand is None:
        check_theme_flag(theme)
        tui_without_a_terminal(ctx.get_help, model, theme, endpoint)
        _open_tui(model, theme, {}, endpoint=endpoint)


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
        typer.Option("--temperature", help="0 is greedy; range [0, 100].",
                     show_default="the model's, else 0.7"),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option("--top-p", help="Nucleus mass in (0, 1].",
                     show_default="the model's, else 1.0"),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k", help="Keep the k most likely tokens; 0 keeps all.",
            show_default="the model's, else 0"
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
            show_default="the model's, else 0",
        ),
    ] = None,
    repetition_penalty: Annotated[
        float | None,
        typer.Option(
            "--repetition-penalty",
            help="Penalize tokens already in the prompt or reply; (0, 100], 1 disables.",
            show_default="the model's, else 1.0",
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
    raw: Annotated[
        bool, typer.Option("--raw", help="On a terminal, print plain text instead of Markdown.")
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object: content, model, finish_reason, "
                     "usage, timings, speculative."),
    ] = False,
    stats: Annotated[
        bool, typer.Option("--stats", help="One stderr line: TTFT, tokens/s, cached tokens.")
    ] = False,
    extract: Annotated[
        bool, typer.Option("-x", "--extract", help="Print only the fenced code block(s).")
    ] = False,
    continue_: Annotated[
        bool,
        typer.Option("-c", "--continue", help="Continue the most recent conversation."),
    ] = False,
    conversation: Annotated[
        str | None,
        typer.Option("--conversation", help="Continue conversation ID (see 'history list').",
                     show_default=False),
    ] = None,
    no_save: Annotated[
        bool, typer.Option("--no-save", help="Do not store this turn in the history.")
    ] = False,
    draft: Annotated[
        str | None,
        typer.Option("--draft", help="Draft model for speculative decoding ('auto': the "
                     "catalog's pairing; 'ngram': prompt lookup, no draft model).",
                     show_default=False),
    ] = None,
    num_speculative_tokens: Annotated[
        int | None,
        typer.Option("--num-speculative-tokens", help="Most draft tokens per step (with --draft).",
                     show_default="4"),
    ] = None,
    quant: QuantOpt = None,
    context: ContextOpt = None,
    local: Annotated[
        bool, typer.Option("--local", help="Load the model in this process even when a "
                           "'localchat serve' is running.")
    ] = False,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="OpenAI-compatible server URL to answer "
                                 "(env LOCALCHAT_ENDPOINT, config 'endpoint'; its key: env "
                                 "LOCALCHAT_API_KEY, config 'api_key').",
                                 show_default=False)
    ] = None,
    keep_alive: Annotated[
        str | None, typer.Option("--keep-alive", help="Answer through a 'localchat serve' "
                                 "started for the model and kept loaded this long after "
                                 "its last request (5m, 1h; 0: none), so the next ask "
                                 "starts at once (env LOCALCHAT_KEEP_ALIVE, config "
                                 "'keep_alive').", show_default="0")
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Answer one prompt, streaming the reply to stdout; the turn is saved to the history."""
    from localchat.app.ask_cmd import AskArgs, run_ask

    knobs = {
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed,
        "max_tokens": max_tokens, "min_p": min_p, "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty, "frequency_penalty": frequency_penalty,
        "stop": tuple(stop) if stop else None,
    }
    run_ask(AskArgs(
        prompt=prompt, model=model, system=system, draft=draft, quant=quant, sampling=knobs,
        num_speculative_tokens=num_speculative_tokens, context=context,
        no_stream=no_stream, no_stdin=no_stdin, raw=raw, json=json_out, stats=stats,
        extract=extract, continue_=continue_, conversation=conversation, no_save=no_save,
        local=local, endpoint=endpoint, keep_alive=keep_alive,
    ))


@app.command()
def chat(
    jsonl: Annotated[
        bool, typer.Option("--jsonl", help="Read JSON lines on stdin, write one per reply.")
    ] = False,
    model: Annotated[
        str | None, typer.Option("-m", "--model", help="Model spec (as in ask).",
                                 show_default=False)
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", show_default=False)] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature",
                                   show_default="the model's, else 0.7")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", show_default="512")] = None,
    draft: Annotated[
        str | None, typer.Option("--draft", help="Draft model (or 'auto', or 'ngram': prompt "
                                 "lookup) for speculative decoding (with --jsonl).",
                                 show_default=False)
    ] = None,
    num_speculative_tokens: Annotated[
        int | None, typer.Option("--num-speculative-tokens", show_default="4")
    ] = None,
    context: ContextOpt = None,
    theme: ThemeOpt = None,
    local: Annotated[
        bool, typer.Option("--local", help="With --jsonl: load the model in this process "
                           "even when a 'localchat serve' is running.")
    ] = False,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="OpenAI-compatible server URL to answer "
                                 "(the TUI or --jsonl; env LOCALCHAT_ENDPOINT).",
                                 show_default=False)
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Chat in the TUI; with --jsonl: one conversation over JSON lines (see README)."""
    if not jsonl:
        check_jsonl_only(draft=draft, k=num_speculative_tokens, local=local)
        check_theme_flag(theme)
        tui_without_a_terminal(None)
        knobs = {"seed": seed, "temperature": temperature, "max_tokens": max_tokens}
        _open_tui(model, theme, {k: v for k, v in knobs.items() if v is not None},
                  context=context, endpoint=endpoint)
        return
    from localchat.app.chat_jsonl import JsonlArgs, run_jsonl

    run_jsonl(JsonlArgs(model=model, draft=draft, num_speculative_tokens=num_speculative_tokens,
                        seed=seed, temperature=temperature, max_tokens=max_tokens,
                        context=context, local=local, endpoint=endpoint))


app.command("serve")(serve_command)
app.add_typer(history_app)
app.add_typer(config_app)
app.add_typer(cache_app)
app.command("pull")(pull_command)
app.command("models")(models_command)
app.command("rm")(rm_command)
app.command("plan")(plan_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and exit with its code."""
    from localchat.app import cli_coerce

    command = typer.main.get_command(app)
    cli_coerce.install(command)  # plain values without pydantic (a warm ``ask`` is start-up)
    cli_coerce.flags_show_no_type(command)
    cli_io.engine_log_lines()
    code = interrupts.with_stop_lines(lambda: cli_io.run_cli(command, argv))
    sys.exit(code)


# --- helpers -------------------------------------------------------------------------------


def _open_tui(model: str | None, theme: str | None, sampling: dict[str, Any],
              context: int | None = None, endpoint: str | None = None) -> None:
    """Run the chat TUI (``app/tui``) until the user quits."""
    from localchat.app.tui.app import run_tui

    check_model_flag(model)
    raise typer.Exit(run_tui(model=model, theme=theme, sampling=sampling, context=context,
                             endpoint=endpoint))


if __name__ == "__main__":
    main()
