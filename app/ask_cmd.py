"""What ``localchat ask`` does, between parsing (``cli.py``) and the engine.

One turn: merge flags over settings (flag > environment > config file > the model's
recommended sampling, ``model_defaults.py`` > default), compose the
prompt (stdin, blank line, argument), load the engine, render the conversation (earlier turns
with ``-c``/``--conversation``) into prompt token ids that fit the context, commit the user's
message to the history, stream the reply through a writer (``render.py``), then commit the
reply (marked interrupted after Ctrl+C) and report ``--json`` / ``--stats``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer

from localchat.app import cli_io, interrupts, render
from localchat.app.cli_io import CliUsageError
from localchat.app.load_options import LoadOptions, check_load_options, context_choice
from localchat.app.report import answer_stats, format_stats_line

if TYPE_CHECKING:  # torch stays out of ``localchat --help``
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.outputs import RequestOutput
    from localchat.engine.sampling_params import SamplingParams

# SamplingParams field -> the flag that sets it (used to name the flag in range errors).
SAMPLING_FLAGS = {
    "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed",
    "max_tokens": "--max-tokens", "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty", "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty", "stop": "--stop",
}


# The SamplingParams fields ``--json`` reports under "sampling" (the values in use).
SAMPLING_SHOWN = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                  "seed")


@dataclass
class AskArgs:
    """``ask``'s parsed command line; None means "not given" (settings or defaults apply)."""

    prompt: str | None = None
    model: str | None = None
    system: str | None = None
    draft: str | None = None
    quant: str | None = None
    num_speculative_tokens: int | None = None
    context: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams field -> flag value
    no_stream: bool = False
    no_stdin: bool = False
    raw: bool = False
    json: bool = False
    stats: bool = False
    extract: bool = False
    continue_: bool = False
    conversation: str | None = None
    no_save: bool = False
    local: bool = False  # never use a running server or an endpoint
    endpoint: str | None = None  # an OpenAI-compatible server to answer instead


def run_ask(args: AskArgs) -> None:
    """Run one ``ask`` turn; raises ``typer.Exit`` with 130 after Ctrl+C (reply kept).

    Raises:
        CliUsageError: a bad flag value, no prompt, ``-c`` with ``--conversation``, an option
            the engine does not offer yet (exit 2).
        LocalchatError: unknown model or conversation, bad settings, prompt too long (exit 1).
    """
    from localchat.app.settings import load_settings
    from localchat.engine.sampling_params import SamplingParams

    if args.conversation is not None and not args.conversation.strip():
        raise CliUsageError("--conversation needs a conversation id (see 'localchat history "
                            "list'); use -c to continue the most recent one")
    if args.continue_ and args.conversation:
        raise CliUsageError("use either -c/--continue or --conversation ID, not both")
    settings = load_settings()
    for name in settings.unknown_keys:
        cli_io.warn(f"config file: unknown key '{name}' (ignored; see 'localchat config show')")
    knobs = {**settings.sampling, **{k: v for k, v in args.sampling.items() if v is not None}}
    try:
        sampling = SamplingParams(**knobs)
    except ValueError as e:
        raise CliUsageError(cli_io.sampling_error_message(e, SAMPLING_FLAGS)) from None
    prompt = cli_io.valid_utf8(args.prompt, "the PROMPT argument")
    text = cli_io.build_prompt(prompt, "" if args.no_stdin else cli_io.read_stdin())

    store, conv = _open_history(args)
    try:
        model = args.model or (conv.model if conv and conv.model else settings.default_model)
        context, context_origin = context_choice(args.context, settings)
        options = LoadOptions(model=model, draft=args.draft or settings.draft,
                              quant=args.quant or settings.quant or "auto",
                              num_speculative_tokens=args.num_speculative_tokens,
                              context=context, context_origin=context_origin)
        check_load_options(options, from_flags={"draft": bool(args.draft),
                                                "quant": bool(args.quant)})
        from localchat.app.session import ChatSession

        system = args.system or (conv.system_prompt if conv else None) or settings.system_prompt
        session = ChatSession(system=system)
        for role, content in _alternating(conv.messages if conv else [], text):
            (session.add_user if role == "user" else session.add_assistant)(content)
        from_setting = not args.model and not (conv and conv.model)
        engine = remote_backend(args, settings, model)
        if engine is None:
            cli_io.guarded(lambda: _check_prompt_before_load(options, session, sampling.max_tokens))
            engine = _load_naming_the_setting(options, settings, from_setting)
        sampling = with_model_defaults(model, knobs, sampling)
        if getattr(engine, "remote", False):  # the server renders the messages itself
            prompt_ids = session.to_messages()
        else:
            prompt_ids = fit_prompt(session, engine.tokenizer, engine.max_model_len,
                                    sampling.max_tokens)
        conv_id = parent_id = None
        if store is not None:
            conv_id, parent_id = _save_user(store, conv, args, model, system, text)
            if conv_id is None:  # the history failed (said once): answer without saving
                store.close()
                store = None
        _answer(engine, prompt_ids, sampling, args, store, conv_id, model, parent_id)
    finally:
        if store is not None:
            store.close()


def with_model_defaults(model: str, knobs: dict[str, Any], sampling: Any) -> Any:
    """``SamplingParams`` of the model's recommended values (``model_defaults``) overlaid
    with the user's ``knobs`` (settings and flags, already checked in ``sampling``)."""
    from localchat.app.model_defaults import recommended_sampling
    from localchat.engine.sampling_params import SamplingParams

    recommended, _origin = recommended_sampling(model)
    if not recommended:
        return sampling
    return SamplingParams(**{**recommended, **knobs})


def remote_backend(args: Any, settings: Any, model: str) -> Any:
    """A ``RemoteEngine`` (``--endpoint`` or a running ``localchat serve``) or None for an
    in-process engine (``app/server/backend.py``)."""
    from localchat.app.server.backend import choose_backend

    return choose_backend(model, explicit_model=bool(args.model), local=args.local,
                          endpoint=args.endpoint, settings=settings,
                          engine_flags=bool(getattr(args, "draft", None)
                                            or getattr(args, "quant", None)
                                            or getattr(args, "context", None)))


def _check_prompt_before_load(options: LoadOptions, session: Any, max_tokens: int | None
                              ) -> None:
    """Fail fast on a prompt that no context of this model can hold: tokenize it with the
    model's (cached) tokenizer against its trained positions, before any weight is loaded.
    The engine's own context is never larger, so this only rejects what would fail later.
    Models not on disk yet, or whose config or tokenizer cannot be read, are left to the
    load (which says what is wrong). Raises ``ContextLengthError`` (exit 1)."""
    from localchat.app.session import fit_prompt as fit
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model

    try:
        source = resolve_model(options.model, cache_dir=cache_dir(), download=False)
    except LocalchatError:  # not on disk (or not resolvable): the load says why
        return
    from localchat.engine.loader import load_model_config
    from localchat.engine.tokenizer import Tokenizer

    try:
        bound = load_model_config(source.path, cache_dir()).max_position_embeddings
        tokenizer = Tokenizer.from_pretrained(source.path, cache_dir=cache_dir())
    except LocalchatError:  # an unreadable model: the load names what is wrong with it
        return
    if getattr(options, "context", None):
        bound = min(bound, options.context)
    fit(session, tokenizer, bound, max_tokens)  # notices come from the real fit, after load


def load_engine(options: LoadOptions) -> LLMEngine:
    """Resolve the model and load an ``LLMEngine`` (notice on stderr when a terminal); a
    second Ctrl+C while loading ends the process at once (``interrupts.loading_interrupts``)."""
    from localchat.app import engine_loader

    with interrupts.loading_interrupts():
        return engine_loader.load(options)


def _load_naming_the_setting(options: LoadOptions, settings: Any, from_setting: bool) -> Any:
    """``load_engine``; when the model came from the ``default_model`` setting and cannot be
    found, the error says where that setting lives (config.toml or the environment)."""
    from localchat.app.settings import KEYS, config_path
    from localchat.engine.errors import ModelNotFoundError

    try:
        return cli_io.guarded(lambda: load_engine(options))
    except ModelNotFoundError as exc:
        source = settings.sources.get("default_model")
        if not from_setting or source is None:
            raise
        where = f"config file {config_path()}" if source == "config" else \
            f"environment variable {KEYS['default_model'].env}"
        raise ModelNotFoundError(f"default_model (from {where}): {exc}") from None


def fit_prompt(session: Any, tokenizer: Any, max_model_len: int, max_tokens: int | None
               ) -> list[int]:
    """``session.fit_prompt``, its notices printed as ``localchat: note:`` lines on stderr.

    Raises ``ContextLengthError`` when the prompt leaves no room for a reply (exit 1).
    """
    from localchat.app.session import fit_prompt as fit

    ids, notes = fit(session, tokenizer, max_model_len, max_tokens)
    for note in notes:
        cli_io.note(note)
    return ids


# -- internals -------------------------------------------------------------------------------


def _open_history(args: AskArgs) -> tuple[Any, Any]:
    """The store (None with ``--no-save``) and the conversation to continue (or None)."""
    continuing = bool(args.continue_ or args.conversation)
    if args.no_save and not continuing:
        return None, None
    from localchat.app.store import Store
    from localchat.engine.errors import LocalchatError

    try:
        store = Store()
    except LocalchatError as exc:
        if continuing:
            raise
        _not_saved(exc)  # answering matters more than saving
        return None, None
    try:
        conv = None
        if args.conversation:
            conv = store.get_conversation(args.conversation)
        elif args.continue_:
            conv = store.most_recent()
            if conv is None:
                cli_io.note("no earlier conversation to continue; starting a new one")
    except BaseException:
        store.close()
        raise
    if args.no_save:
        store.close()
        return None, conv
    return store, conv


def stored_model(spec: str) -> str:
    """The model spec as the history keeps it: a local file or folder as its absolute, resolved
    path (so ``-c`` works from any folder); a catalog alias or Hub repo id as given."""
    from pathlib import Path

    path = Path(spec).expanduser()
    try:
        return str(path.resolve()) if path.exists() else spec
    except (OSError, RuntimeError):  # an unreadable path or a symlink loop: keep it as given
        return spec


def _not_saved(exc: Exception) -> None:
    """The one stderr line saying this turn is not in the history, and why (the file, the
    reason and what to do: ``HistoryUnavailable``'s message)."""
    cli_io.warn(f"this turn is not saved: {exc}")


def _save_user(store: Any, conv: Any, args: AskArgs, model: str, system: str | None,
               text: str) -> tuple[str | None, int | None]:
    """Create (or update) the conversation and commit the user's message before generation
    starts; ``(conversation id, message id)``, or Nones when the history cannot be written
    (said on stderr)."""
    from localchat.app.store import HistoryUnavailable

    created = None
    try:
        if conv is None:
            conv = created = store.create_conversation(stored_model(model), system,
                                                       _explicit(args.sampling))
        elif args.system and args.system != conv.system_prompt:
            store.update_conversation(conv.id, system_prompt=args.system)
        message = store.add_message(conv.id, "user", text)
    except HistoryUnavailable as exc:
        _not_saved(exc)
        if created is not None:  # leave no empty conversation behind when possible
            with contextlib.suppress(Exception):
                store.delete_conversation(created.id)
        return None, None
    return conv.id, message.id


def _alternating(stored: list[Any], text: str) -> list[tuple[str, str]]:
    """Earlier turns plus the new user message, as alternating (role, content) pairs: a user
    message left without a reply (a crash mid-reply) is joined to the next user message with a
    blank line, as chat templates may require alternating roles."""
    turns: list[tuple[str, str]] = []
    for role, content in [(m.role, m.content) for m in stored] + [("user", text)]:
        if role not in ("user", "assistant"):
            continue
        if turns and turns[-1][0] == role:
            turns[-1] = (role, turns[-1][1] + "\n\n" + content)
        else:
            turns.append((role, content))
    return turns


def _explicit(knobs: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags given on the command line, JSON-ready (for the conversation row)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in knobs.items() if v is not None}


def _make_writer(args: AskArgs) -> Any:
    markdown = cli_io.stream_isatty(sys.stdout) and not args.raw
    if args.json or args.extract or (markdown and args.no_stream):
        return render.BufferedWriter()
    if markdown:
        return render.MarkdownWriter()
    return cli_io.AnswerWriter(buffered=args.no_stream)


def _answer(engine: LLMEngine, prompt_ids: list[int], sampling: SamplingParams,
            args: AskArgs, store: Any, conv_id: str | None, model: str,
            parent_id: int | None = None) -> None:
    """Generate and show the reply, then save it and report; Ctrl+C, SIGTERM and SIGHUP keep
    the partial reply (shown, saved as interrupted) and exit 128 + the signal (130, 143, 129);
    a closed stdout exits 141."""
    writer = _make_writer(args)
    outputs: Iterator[RequestOutput] | None = None
    last: RequestOutput | None = None
    interrupted = False
    guard = interrupts.InterruptGuard()
    try:
        with guard.installed():
            outputs = engine.generate(prompt_ids, sampling)
            for out in outputs:
                with guard.critical():  # shown and recorded together, or neither
                    last = out
                    writer.write(out.text_delta)
                if out.finished:
                    break
    except KeyboardInterrupt:
        interrupted = True
        _close_quietly(outputs)
    except BrokenPipeError:  # the reader went away (`| head`): stop generating, quietly
        _close_quietly(outputs)
        cli_io.silence_stdout()
        _save_reply(store, conv_id, writer.text, True, None, parent_id)
        raise typer.Exit(cli_io.EXIT_BROKEN_PIPE) from None
    # Finish saving and printing whatever arrives now.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in interrupts.STOP_SIGNALS}
    try:
        stats = answer_stats(last, len(prompt_ids), interrupted)
        _save_reply(store, conv_id, writer.text, interrupted, stats, parent_id)
        if args.json:
            stats["context"] = getattr(engine, "max_model_len", None)  # the value in use
            stats["sampling"] = {k: getattr(sampling, k) for k in SAMPLING_SHOWN}
            stats["memory"] = _memory(engine)
        _print_answer(writer, args, stats, model, conv_id)
    except BrokenPipeError:
        cli_io.silence_stdout()
        raise typer.Exit(cli_io.EXIT_BROKEN_PIPE) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if interrupted:  # 130 after Ctrl+C, 143 after SIGTERM, 129 after SIGHUP
        raise typer.Exit(128 + guard.signum if guard.signum else cli_io.EXIT_INTERRUPTED)


def _memory(engine: Any) -> dict[str, Any] | None:
    """``--json``'s ``memory``: the planner's prediction for the engine as loaded beside the
    bytes allocated (``memory_figures.py``)."""
    try:
        from localchat.app.memory_figures import memory_figures

        return memory_figures(engine)
    except (AttributeError, TypeError, ValueError, OSError):  # a fake engine in tests
        return None


def _print_answer(writer: Any, args: AskArgs, stats: dict[str, Any], model: str,
                  conv_id: str | None) -> None:
    text = writer.text
    if args.extract:
        blocks = render.extract_code_blocks(text)
        if not blocks and text.strip() and not args.json:  # --json says it in "content"
            cli_io.note("the answer has no complete fenced code block; printing it whole")
        text = "\n\n".join(blocks) if blocks else text
    if args.json:
        doc = {"content": text, "model": model, "conversation_id": conv_id, **stats}
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    elif args.extract:
        plain = cli_io.AnswerWriter(buffered=True)
        plain.write(text)
        plain.finish()
    elif isinstance(writer, render.BufferedWriter):  # --no-stream on a terminal
        markdown = render.MarkdownWriter()
        markdown.write(text)
        markdown.finish()
    else:
        writer.finish()
    if args.stats:
        cli_io.stats_line(format_stats_line(stats))


def _save_reply(store: Any, conv_id: str | None, text: str, interrupted: bool,
                stats: dict[str, Any] | None, parent_id: int | None = None) -> None:
    if store is None or conv_id is None:
        return
    from localchat.app.store import HistoryUnavailable

    try:
        store.add_message(conv_id, "assistant", text, interrupted=interrupted, stats=stats,
                          parent_id=parent_id)
    except HistoryUnavailable as exc:  # the user's message is saved; the reply is not
        cli_io.warn(f"the reply is not saved: {exc}")


def _close_quietly(outputs: Any) -> None:
    """Close a generator (the engine aborts the request); ignore a second Ctrl+C."""
    close = getattr(outputs, "close", None)
    if close is not None:
        with contextlib.suppress(Exception, KeyboardInterrupt):
            close()
