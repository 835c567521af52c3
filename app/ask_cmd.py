"""What ``localchat ask`` does, between parsing (``cli.py``) and the engine.

One turn: merge flags over settings (flag > environment > config file > the model's
recommended sampling, ``model_defaults.py`` > default), compose the prompt (stdin, blank
line, argument), choose the backend (a running ``localchat serve`` or ``--endpoint``, else,
after ``prompt_check`` rejected a prompt no context holds, a server started with
``--keep-alive`` or an engine loaded here), render the
conversation (earlier turns with ``-c``/``--conversation``, ``ask_history``) into prompt token
ids that fit the context, commit the user's message, then stream, save and report the reply
(``ask_reply``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer

from localchat.app import cli_input, cli_io, interrupts, unsent
from localchat.app.ask_history import alternating, open_history, save_reply, save_user
from localchat.app.ask_reply import answer
from localchat.app.cli_io import CliUsageError
from localchat.app.load_options import (
    LoadOptions,
    check_load_options,
    check_model_flag,
    context_choice,
    flag_or_setting,
)
from localchat.app.prompt_check import check_prompt_before_load
from localchat.engine.errors import LocalchatError

if TYPE_CHECKING:  # torch stays out of ``localchat --help``
    from localchat.engine.llm_engine import LLMEngine

# SamplingParams field -> the flag that sets it (used to name the flag in range errors).
SAMPLING_FLAGS = {
    "temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed",
    "max_tokens": "--max-tokens", "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty", "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty", "stop": "--stop",
}


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
    keep_alive: str | None = None  # start a server kept this long (a duration; ``keep_alive.py``)


def run_ask(args: AskArgs) -> None:
    """Run one ``ask`` turn; raises ``typer.Exit`` with 128 + the signal after Ctrl+C,
    SIGTERM or SIGHUP (reply kept) and 141 when stdout closes (``ask_reply.answer``).

    Raises:
        CliUsageError: a bad flag value, no prompt, ``-c`` with ``--conversation``, an option
            the engine does not offer yet (exit 2).
        LocalchatError: unknown model or conversation, bad settings, prompt too long (exit 1).
    """
    from localchat.app.settings import load_settings
    from localchat.engine.sampling_params import SamplingParams

    # stdin first: piped text, read once, is kept if the turn fails before it is saved
    piped = None if args.no_stdin else cli_input.read_stdin()
    store = None
    saved = False  # the user's message is in the history (a failure there says so)
    try:
        check_model_flag(args.model)
        if args.conversation is not None and not args.conversation.strip():
            raise CliUsageError("--conversation needs a conversation id (see 'localchat history "
                                "list'); use -c to continue the most recent one")
        if args.continue_ and args.conversation:
            raise CliUsageError("use either -c/--continue or --conversation ID, not both")
        settings = load_settings()
        keep_alive = keep_alive_seconds(args, settings)
        from localchat.app.config_cli import unknown_key_warning

        for name in settings.unknown_keys:
            cli_io.warn(unknown_key_warning(name))
        flags = {k: v for k, v in args.sampling.items() if v is not None}
        knobs = {**settings.sampling, **flags}
        try:
            sampling = SamplingParams(**knobs)
        except ValueError as e:
            raise CliUsageError(cli_io.sampling_error_message(e, SAMPLING_FLAGS)) from None
        prompt = cli_input.valid_utf8(args.prompt, "the PROMPT argument")
        text = cli_input.build_prompt(prompt, piped)
        if prompt is None and args.system:  # ("-sorry": a prompt read as -s "orry")
            from localchat.app.argv_hints import warn_misread_system_prompt

            warn_misread_system_prompt()

        store, conv = open_history(args)
        model = args.model or (conv.model if conv and conv.model else settings.default_model)
        context, context_origin = context_choice(args.context, settings)
        draft, draft_origin = flag_or_setting(args.draft, settings, "draft")
        quant, quant_origin = flag_or_setting(args.quant, settings, "quant")
        options = LoadOptions(model=model, draft=draft, quant=quant or "auto",
                              num_speculative_tokens=args.num_speculative_tokens,
                              context=context, context_origin=context_origin,
                              draft_origin=draft_origin, quant_origin=quant_origin)
        check_load_options(options)
        from localchat.app.session import ChatSession

        system = args.system or (conv.system_prompt if conv else None) or settings.system_prompt
        session = ChatSession(system=system)
        for role, content in alternating(conv.messages if conv else [], text):
            (session.add_user if role == "user" else session.add_assistant)(content)
        from_setting = not args.model and not (conv and conv.model)
        engine = remote_backend(args, settings, model)
        try:
            if engine is None:  # (a server started for --keep-alive loads during the check)
                engine = cli_io.guarded(lambda: kept_alive_backend(
                    args, settings, model, keep_alive,
                    lambda: check_prompt_before_load(options, session, sampling.max_tokens)),
                    say=False)
            if engine is not None:
                model = engine.model  # an endpoint asked without -m answers with its own model
            else:
                engine = _load_naming_the_setting(options, settings, from_setting,
                                                  conv if not args.model else None)
        except typer.Exit as exc:
            if exc.exit_code in interrupts.STOP_EXIT_CODES:
                conv_id = None
                if store is not None:
                    conv_id = keep_turn_interrupted_while_loading(store, conv, args, model,
                                                                  system, text)
                else:  # no history (--no-save, or it cannot be used): a file, unless --no-save
                    kept = None if args.no_save else unsent.keep_piped_text(piped)
                    cli_io.interrupted(f"the piped text is kept in {kept}" if kept else "",
                                       interrupts.loading_signal())
                if args.json:
                    json_interrupted_while_loading(model, conv_id)
            raise
        sampling = with_model_defaults(model, knobs, sampling)
        if getattr(engine, "remote", False):  # the server renders the messages itself
            prompt_ids = session.to_messages()
        else:
            prompt_ids = fit_prompt(session, engine.tokenizer, engine.max_model_len,
                                    sampling.max_tokens)
        conv_id = parent_id = None
        if store is not None:
            conv_id, parent_id = save_user(store, conv, args, model, system, text)
            saved = conv_id is not None
            if conv_id is None:  # the history failed (said once): answer without saving
                store.close()
                store = None
        answer(engine, prompt_ids, sampling, args, store, conv_id, model, parent_id)
    except (LocalchatError, CliUsageError) as exc:
        # the piped text, unless the history holds it (a refused turn was taken back) or
        # the user asked for nothing to be saved
        if not args.no_save and (not saved or getattr(exc, "refused", False)):
            unsent.with_kept_text(exc, piped)
        raise
    except (typer.Exit, typer.Abort):  # (said where raised: Ctrl+C, a closed stdout)
        raise
    except Exception:  # an internal error (its own line follows): the text is kept too
        path = None if args.no_save or saved else unsent.keep_piped_text(piped)
        if path is not None:
            cli_io.note(f"the piped text is kept in {path}")
        raise
    finally:
        if store is not None:
            store.close()


def json_interrupted_while_loading(model: str, conv_id: str | None) -> None:
    """``--json``'s object for a turn interrupted before the model loaded, with every key of
    an answered one (``content`` empty, ``finish_reason`` ``interrupted``; what was never
    measured, the prompt's token count included, null), so a script reads the same shape."""
    from localchat.app.report import answer_stats

    doc = {"content": "", "model": model, "conversation_id": conv_id,
           **answer_stats(None, None, True), "context": None, "sampling": None, "memory": None}
    with contextlib.suppress(OSError, ValueError):  # a closed stdout: the exit code says it
        sys.stdout.write(cli_io.json_line(doc, sys.stdout))
        sys.stdout.flush()


def keep_turn_interrupted_while_loading(store: Any, conv: Any, args: Any, model: str,
                                        system: str | None, text: str) -> str | None:
    """Ctrl+C (SIGTERM, SIGHUP) while the model loads: the user's message is saved with an
    empty reply marked interrupted, as when Ctrl+C comes before the first token of the reply,
    so a prompt that came down a pipe is not lost (``history show``, ``-c``); returns the
    conversation id (None when the history failed: one stderr line, ``save_user``)."""
    conv_id, message_id = save_user(store, conv, args, model, system, text)
    save_reply(store, conv_id, "", True, None, message_id)
    cli_io.interrupted(f"your message is saved in conversation {conv_id}"
                       if conv_id is not None else "", interrupts.loading_signal())
    return conv_id


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
                          engine_flags=engine_flags(args))


def engine_flags(args: Any) -> list[str]:
    """The flags of ``args`` that configure a model loaded in this process (``--draft``,
    ``--num-speculative-tokens``, ``--quant``, ``--context``), in that order, as given."""
    return [flag for flag, attr in (("--draft", "draft"),
                                    ("--num-speculative-tokens", "num_speculative_tokens"),
                                    ("--quant", "quant"), ("--context", "context"))
            if getattr(args, attr, None) is not None]


def keep_alive_seconds(args: Any, settings: Any) -> float:
    """``--keep-alive`` (else the ``keep_alive`` setting) in seconds; 0.0 when unset.

    Raises:
        CliUsageError: the flag is not a duration (exit 2; the setting is checked when read).
    """
    from localchat.app.keep_alive import parse_duration

    if args.keep_alive is None:
        return parse_duration(settings.keep_alive) if settings.keep_alive else 0.0
    try:
        return parse_duration(args.keep_alive)
    except ValueError as exc:
        raise CliUsageError(f"--keep-alive: {exc}") from None


def kept_alive_backend(args: Any, settings: Any, model: str, seconds: float,
                       check: Any) -> Any:
    """A ``RemoteEngine`` on a server for ``model`` kept ``seconds`` after its last request
    (``keep_alive.kept_alive_server``, which runs ``check``, the prompt check, while it
    loads), or None, after ``check``, to load in-process: no keep-alive (0), ``--local``,
    an endpoint, an engine flag (``engine_flags``: a server's own choices would be used
    instead), or no server could be used (model not on disk, another
    model's server registered, it did not start: said in a note)."""
    flags = [f for f, on in (("--local", args.local), ("--endpoint", args.endpoint)) if on]
    flags += engine_flags(args)
    if not seconds or flags or settings.endpoint:
        if seconds and args.keep_alive is not None:  # asked for on this command line
            why = flags[0] if flags else "the endpoint setting"
            cli_io.note(f"--keep-alive is not used with {why}; answering here")
        check()
        return None
    from localchat.app.keep_alive import kept_alive_server
    from localchat.app.server.client import RemoteEngine

    info = kept_alive_server(model, seconds, check)
    if info is None:
        return None
    return RemoteEngine(info.url, settings.api_key, info.model, local_server=True)


def load_engine(options: LoadOptions) -> LLMEngine:
    """Resolve the model and load an ``LLMEngine`` (notice on stderr when a terminal); a
    second Ctrl+C while loading ends the process at once (``interrupts.loading_interrupts``);
    no automatic garbage collection during the load, what it built frozen after it
    (``startup_gc``: a one-shot process)."""
    from localchat.app import engine_loader
    from localchat.app.startup_gc import collected_after_load

    with interrupts.loading_interrupts(), collected_after_load():
        return engine_loader.load(options)


def _load_naming_the_setting(options: LoadOptions, settings: Any, from_setting: bool,
                             conv: Any = None) -> Any:
    """``load_engine``; when the model came from the ``default_model`` setting, or from the
    conversation ``conv`` being continued (``-c`` without ``-m``), and cannot be found, the
    error says where it came from and what to do."""
    from localchat.app.settings import KEYS, config_path
    from localchat.engine.errors import ModelNotFoundError

    try:
        return cli_io.guarded(lambda: load_engine(options), say=False)
    except ModelNotFoundError as exc:
        if conv is not None and conv.model and conv.model == options.model:
            raise ModelNotFoundError(f"{exc} (the model of conversation {conv.id}; continue "
                                     "it with another: -m MODEL)") from None
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
