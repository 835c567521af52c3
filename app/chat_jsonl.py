"""``localchat chat --jsonl``: one conversation driven by JSON lines on stdin.

Input, one JSON object per line:
``{"role": "user", "content": "..."}`` adds a user turn and answers it;
``{"role": "system", "content": "..."}`` sets the system prompt;
``{"command": "reset"}`` starts the conversation over (the system prompt stays).
Output, one JSON object per line on stdout: per reply ``content``, ``finish_reason``,
``usage`` (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``), ``timings``
(``ttft_s``, ``prefill_tokens_per_s``, ``decode_tokens_per_s``), ``spec`` (draft tokens
proposed and accepted, acceptance rate; null without ``--draft``) and ``dropped_turns``; ``{"ok": true, ...}`` acknowledges a system
prompt or a reset; ``{"error": "..."}`` answers a malformed line, a turn the context cannot
hold, or a turn a server refused or dropped (that turn is not kept), and the conversation goes
on. The engine keeps the conversation's earlier turns in its prefix cache, so each turn
prefills only the new tokens (``usage.cached_tokens`` says how many were reused). Ctrl+C
(SIGTERM, SIGHUP) during a reply writes that turn's line (the reply so far, ``finish_reason``
``"interrupted"``), then ends the command as ``ask`` does (``localchat: interrupted``, exit
130; ``stopped by SIGTERM``, 143; 129).
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import typer

from localchat.app import cli_io
from localchat.app.report import answer_stats
from localchat.engine.errors import ContextLengthError

if TYPE_CHECKING:
    from localchat.app.session import ChatSession
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.outputs import RequestOutput
    from localchat.engine.sampling_params import SamplingParams


@dataclass
class JsonlArgs:
    """``chat --jsonl``'s options (None: the settings or SamplingParams' default)."""

    model: str | None = None
    draft: str | None = None
    num_speculative_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    context: int | None = None
    local: bool = False  # never use a running server or an endpoint
    endpoint: str | None = None  # an OpenAI-compatible server to answer instead


def run_jsonl(args: JsonlArgs, stdin: IO[str] | None = None, stdout: IO[str] | None = None
              ) -> None:
    """Serve the JSON-lines conversation until EOF on ``stdin``.

    Raises:
        CliUsageError: a bad option value (exit 2).
        LocalchatError: the model cannot be resolved or loaded (exit 1).
    """
    from localchat.app.ask_cmd import (
        SAMPLING_FLAGS,
        fit_prompt,
        load_engine,
        with_model_defaults,
    )
    from localchat.app.load_options import (
        LoadOptions,
        check_load_options,
        check_model_flag,
        context_choice,
        flag_or_setting,
        setting_origin,
    )
    from localchat.app.server.client import BackendError
    from localchat.app.session import ChatSession
    from localchat.app.settings import load_settings
    from localchat.engine.sampling_params import SamplingParams

    stdin = stdin or sys.stdin
    reconfigure = getattr(stdin, "reconfigure", None)
    if reconfigure is not None:  # an invalid UTF-8 line reaches _parse (and its error line)
        try:
            reconfigure(errors="surrogateescape")
        except (ValueError, OSError):
            pass
    stdout = stdout or sys.stdout
    check_model_flag(args.model)
    settings = load_settings()
    flags = {"seed": args.seed, "temperature": args.temperature, "max_tokens": args.max_tokens}
    knobs = {**settings.sampling, **{k: v for k, v in flags.items() if v is not None}}
    try:
        sampling = SamplingParams(**knobs)
    except ValueError as e:
        raise cli_io.CliUsageError(cli_io.sampling_error_message(e, SAMPLING_FLAGS)) from None
    context, context_origin = context_choice(args.context, settings)
    draft, draft_origin = flag_or_setting(args.draft, settings, "draft")
    options = LoadOptions(model=args.model or settings.default_model, draft=draft,
                          quant=settings.quant or "auto",
                          num_speculative_tokens=args.num_speculative_tokens,
                          context=context, context_origin=context_origin,
                          draft_origin=draft_origin,
                          quant_origin=setting_origin(settings, "quant"))
    check_load_options(options)
    from localchat.app.ask_cmd import remote_backend

    engine = remote_backend(args, settings, options.model) or cli_io.guarded(
        lambda: load_engine(options))
    sampling = with_model_defaults(options.model, knobs, sampling)
    session = ChatSession(system=settings.system_prompt)

    def emit(obj: dict[str, Any]) -> None:
        stdout.write(cli_io.json_line(obj, stdout))
        stdout.flush()

    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = _parse(line)
        except (ValueError, TypeError) as e:
            emit({"error": str(e)})
            continue
        if msg.get("command") == "reset":
            session.clear()
            emit({"ok": True, "command": "reset"})
        elif msg["role"] == "system":
            session.system = msg["content"] or None
            emit({"ok": True, "role": "system"})
        else:
            session.add_user(msg["content"])
            try:
                ids = session.to_messages() if getattr(engine, "remote", False) else \
                    fit_prompt(session, engine.tokenizer, engine.max_model_len,
                               sampling.max_tokens)
            except (ContextLengthError, ValueError) as e:  # unanswerable: say so, go on
                session.messages.pop()
                emit({"error": cli_io.one_line(str(e))})
                continue
            try:
                reply, stopped_by = _answer(engine, ids, sampling, session)
            except BackendError as e:  # the server refused the turn or went away: say so
                session.messages.pop()
                emit({"error": cli_io.one_line(str(e))})
                continue
            emit(reply)
            if stopped_by is not None:  # the turn's line is out: now end as ask does
                cli_io.interrupted(signum=stopped_by)
                raise typer.Exit(128 + stopped_by)


def _parse(line: str) -> dict[str, Any]:
    """Validate one input line. Raises ``ValueError``/``TypeError`` with a one-line reason."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(msg, dict):
        raise TypeError("expected a JSON object")
    known = ("command",) if "command" in msg else ("role", "content")
    unknown = [key for key in msg if key not in known]
    if unknown:  # a misspelt key is an error, as the server's 400 for an unknown field
        raise ValueError(f"unknown field {unknown[0]!r} (a line holds "
                         f"{' and '.join(repr(k) for k in known)})")
    if "command" in msg:
        if msg["command"] != "reset":
            raise ValueError(f"unknown command {msg['command']!r} (known: 'reset')")
        return msg
    role = msg.get("role")
    if role not in ("user", "system"):
        raise ValueError("expected {\"role\": \"user\"|\"system\", \"content\": \"...\"} "
                         "or {\"command\": \"reset\"}")
    if not isinstance(msg.get("content"), str):
        raise TypeError("'content' must be a string")
    try:
        msg["content"].encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate ("\ud800") or bytes that were not UTF-8
        bad = msg["content"][e.start]
        if 0xDC80 <= ord(bad) <= 0xDCFF and bad in line:  # a raw byte (surrogateescape)
            raise ValueError(f"'content' is not valid UTF-8: byte 0x{ord(bad) - 0xDC00:02X} at "
                             f"character {e.start}") from None
        raise ValueError(f"'content' is not valid Unicode text: lone surrogate "
                         f"U+{ord(bad):04X} at character {e.start}") from None
    if role == "user" and not msg["content"].strip():
        raise ValueError("'content' is empty")
    return msg


def _answer(engine: LLMEngine, ids: list[int], sampling: SamplingParams,
            session: ChatSession) -> tuple[dict[str, Any], int | None]:
    """Generate one reply, append it to ``session`` and build its output line; also the
    signal that stopped it (Ctrl+C, SIGTERM, SIGHUP: ``interrupts.InterruptGuard``) or None:
    the line then carries the reply so far with ``finish_reason`` ``"interrupted"``, so a
    script reading the lines gets one per turn."""
    from localchat.app import interrupts

    last: RequestOutput | None = None
    interrupted = False
    guard = interrupts.InterruptGuard()
    outputs = engine.generate(ids, sampling)
    try:
        with guard.installed():
            for out in outputs:
                last = out
    except KeyboardInterrupt:
        interrupted = True
    finally:
        close = getattr(outputs, "close", None)
        if close is not None:
            close()
    text = last.text if last is not None else ""
    session.add_assistant(text)
    stats = answer_stats(last, len(ids), interrupted=interrupted,
                         speculating=getattr(engine, "speculator", None) is not None)
    spec = stats.pop("speculative")
    line = {"content": text, **stats, "spec": spec, "dropped_turns": session.last_dropped_turns}
    if not interrupted:
        return line, None
    return line, guard.signum if guard.signum is not None else signal.SIGINT
