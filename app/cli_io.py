"""Terminal plumbing for the CLI: streamed stdout, one-line errors and exit codes (what the
user typed and piped: ``cli_input.py``).

The error contract (README, Usage): one line on stderr for every user-facing error
(``localchat: error: ...``), no traceback unless ``--debug``; exit 0 ok, 1 runtime error, 2
usage error, 130 interrupted. stdout carries only the answer. Nothing here imports torch or
transformers.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import IO, Annotated, Any

import typer

from localchat.app.output_errors import ClosedStdout, broken_pipe, output_error, silence_stdout
from localchat.engine.errors import LocalchatError

try:  # typer >= 0.2x vendors its own click; older versions use click itself
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exc  # type: ignore[no-redef]

PROG = "localchat"
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `localchat ask ... | head`
# click >= 8.2 raises this for a group called with no arguments and no_args_is_help.
_NoArgsIsHelpError = getattr(click_exc, "NoArgsIsHelpError", ())


class CliUsageError(Exception):
    """A usage error found after parsing (bad flag value, no prompt): exit 2, one line."""


# The ``--debug`` option every command takes (``run_cli`` reads it from argv).
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Show the full traceback on errors.", show_default=False)
]

# The ``--quant`` option of the commands that load a model (ask, serve).
QuantOpt = Annotated[
    str | None,
    typer.Option("--quant", help="Weight format: auto, native, none, fp8, int8 or int4.",
                 show_default="auto"),
]

def one_line(text: str) -> str:
    """Collapse a message onto a single line (multi-line messages are joined with ' ')."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def printable(text: str, keep: str = "") -> str:
    """``text`` with control characters made visible as ``\\xNN`` escapes: C0 (but the ones
    in ``keep``, e.g. ``"\\n\\t"``), DEL and C1, so stored text cannot drive the terminal
    (``ESC[2J`` clearing the screen, OSC sequences retitling the window)."""
    out = []
    for ch in text:
        code = ord(ch)
        if (code < 0x20 or 0x7F <= code <= 0x9F) and ch not in keep:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    return "".join(out)


def json_line(obj: Any, stream: Any) -> str:
    """``obj`` as one JSON line for ``stream``: characters as they are where the stream
    writes UTF-8, ``\\uXXXX`` escapes where it writes another encoding (``PYTHONIOENCODING=
    ascii``, a C locale), whose replacement of what it cannot encode had turned the text into
    ``?`` without a word; either way a JSON reader gets the exact text."""
    import codecs
    import json

    try:
        utf8 = codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name == "utf-8"
    except LookupError:
        utf8 = False
    return json.dumps(obj, ensure_ascii=not utf8) + "\n"


def error(message: str) -> None:
    """Print ``localchat: error: <message>`` as one line on stderr, its control characters
    escaped (:func:`printable`): messages quote what servers, files and users sent."""
    _err_write(f"{PROG}: error: {printable(one_line(message))}\n")


def warn(message: str) -> None:
    """Print ``localchat: warning: <message>`` as one line on stderr (escaped as in
    :func:`error`)."""
    _err_write(f"{PROG}: warning: {printable(one_line(message))}\n")


def note(message: str) -> None:
    """Print ``localchat: note: <message>`` as one line on stderr, terminal or not (escaped
    as in :func:`error`)."""
    _err_write(f"{PROG}: note: {printable(one_line(message))}\n")


def interrupted(detail: str = "", signum: int | None = None) -> None:
    """Print ``localchat: interrupted[; <detail>]`` as one line on stderr: Ctrl+C (or, named,
    the signal ``signum``: SIGTERM, SIGHUP) ended the command; ``detail`` says what was kept."""
    import signal

    what = "interrupted"
    if signum is not None and signum != signal.SIGINT:
        what = f"stopped by {signal.Signals(signum).name}"
    _err_write(f"{PROG}: {what}" + (f"; {one_line(detail)}" if detail else "") + "\n")


def engine_log_lines() -> None:
    """Show the engine's warnings (``localchat.*`` loggers at WARNING and above: a stale
    weight cache rebuilt, a cache that could not be written, the memory plan's note) as
    ``localchat: warning: <message>`` lines on the current stderr, as the CLI's own lines
    look, instead of logging's bare fallback. For ``localchat``'s own process (``cli.main``);
    ``serve``'s logger (``localchat.server``) keeps its handler. Idempotent."""
    import logging

    class _Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                level = "error" if record.levelno >= logging.ERROR else "warning"
                _err_write(f"{PROG}: {level}: {one_line(record.getMessage())}\n")
            except Exception:  # noqa: BLE001 - a log line must never fail the command
                self.handleError(record)

    logger = logging.getLogger("localchat")
    if not any(getattr(h, "_localchat_lines", False) for h in logger.handlers):
        handler = _Lines(logging.WARNING)
        handler._localchat_lines = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def stats_line(message: str) -> None:
    """Print ``localchat: stats: <message>`` as one line on stderr (``ask --stats``)."""
    _err_write(f"{PROG}: stats: {one_line(message)}\n")


def notice(message: str) -> None:
    """Print a short status line on stderr, only when stderr is a terminal."""
    if stream_isatty(sys.stderr):
        _err_write(f"{message}\n")


def stream_isatty(stream: IO[Any] | None) -> bool:
    """True when ``stream`` is an open terminal (False for None, closed or odd streams)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (ValueError, OSError, AttributeError):
        return False


class AnswerWriter:
    """Streams text deltas to stdout, flushing each, and ends the answer with exactly one newline.

    Trailing newlines of the text so far are held back until more text arrives, so the final
    output ends with a single ``\\n`` whatever the model produced; newlines before the answer's
    first other character (a reply opening with blank lines) are not written. With ``buffered``
    (``--no-stream``) nothing is written before ``finish``, which writes the same bytes in one
    go. On a terminal, control characters of the text other than newline and tab are shown
    as visible stand-ins (``term_safe``); ``text`` keeps the answer as generated.
    """

    def __init__(self, stream: IO[str] | None = None, *, buffered: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.buffered = buffered
        self._terminal = stream_isatty(self.stream)  # show control characters, never obey them
        self._pending = ""
        self._held: list[str] = []
        self._written = False  # any character but a newline yet
        self.text = ""

    def write(self, delta: str) -> None:
        """Write one delta (trailing newlines are deferred) and flush."""
        if not delta:
            return
        self.text += delta
        text = self._pending + delta
        if not self._written:
            text = text.lstrip("\n")
        body = text.rstrip("\n")
        self._pending = text[len(body) :]
        if body:
            self._written = True
            if self._terminal:
                from .term_safe import visible_controls

                body = visible_controls(body)
            if self.buffered:
                self._held.append(body)
                return
            self.stream.write(body)
            self.stream.flush()

    def finish(self) -> None:
        """End the answer with exactly one newline (writing the held text first if buffered)."""
        self._pending = ""
        held, self._held = "".join(self._held), []
        self.stream.write(held + "\n")
        self.stream.flush()


def human_size(num_bytes: int | None) -> str:
    """Format a byte count for people (``98.4 MB``); ``—`` when unknown."""
    if num_bytes is None:
        return "—"
    size = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"  # pragma: no cover - unreachable


def stderr_progress(message: str) -> None:
    """The hub's ``progress`` callback: each message as one ``localchat: ...`` line on stderr."""
    _err_write(f"{PROG}: {one_line(message)}\n")


def debug_requested(argv: Sequence[str]) -> bool:
    """True when ``--debug`` is among the options (before ``--``) or LOCALCHAT_DEBUG is set."""
    if os.environ.get("LOCALCHAT_DEBUG", "") not in ("", "0"):
        return True
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--debug":
            return True
    return False


def sampling_error_message(err: ValueError, flags: dict[str, str]) -> str:
    """Rewrite a ``SamplingParams`` message to name the CLI flag instead of the field.

    ``flags`` maps field names to flags, e.g. ``{"temperature": "--temperature"}``.
    """
    msg = one_line(str(err))
    for field_name, flag in sorted(flags.items(), key=lambda kv: -len(kv[0])):
        if msg.startswith((field_name + " ", field_name + ":")):
            return flag + msg[len(field_name) :]
    return f"invalid sampling option: {msg}"


class _CarriedInterrupt(BaseException):
    """A KeyboardInterrupt carried out of a command past typer, which would turn it into a
    silent exit 130 (``run_cli`` prints the ``interrupted`` line)."""


def _carry_interrupts(command: Any) -> None:
    """Wrap ``command.invoke`` (once) so a KeyboardInterrupt no command handled itself leaves
    it as ``_CarriedInterrupt``."""
    if getattr(command, "_localchat_carries_interrupts", False):
        return
    invoke = command.invoke

    def carried(ctx: Any) -> Any:
        try:
            return invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _CarriedInterrupt() from exc

    command.invoke = carried
    command._localchat_carries_interrupts = True


def run_cli(command: Any, argv: Sequence[str] | None = None) -> int:
    """Run a click/typer command and map every outcome to an exit code (module docstring).

    Usage errors -> one line, 2; ``LocalchatError`` -> one line, its ``exit_code`` (1 unless
    it says 2: a flag value found bad only after parsing); Ctrl+C -> ``interrupted`` line, 130;
    a closed stdout -> 141, quietly; a failed write to stdout (full disk, I/O error) -> one
    line naming it, 1; anything else -> ``internal error`` line, 1. With ``--debug`` runtime
    errors re-raise (traceback).
    """
    from localchat.app.argv_hints import remember, with_misread_prompt
    from localchat.app.cli_input import valid_argument

    args = [valid_argument(a) for a in (sys.argv[1:] if argv is None else argv)]
    remember(args)
    debug = debug_requested(args)
    _tolerant_streams()
    if not debug and not sys.warnoptions:  # library warnings are noise on a user's stderr
        warnings.simplefilter("ignore")
    _carry_interrupts(command)
    try:
        rv = command.main(args=args, prog_name=PROG, standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except _NoArgsIsHelpError as e:
        # typer's rich help is printed while the error is built (ctx.get_help() writes it);
        # a plain click help comes back as the message
        if e.message.strip():
            typer.echo(e.message)
        return EXIT_OK
    except click_exc.UsageError as e:
        error(with_misread_prompt(args, _usage_message(e)))
        return EXIT_USAGE
    except click_exc.ClickException as e:
        error(e.format_message())
        return e.exit_code
    except CliUsageError as e:
        error(with_misread_prompt(args, str(e)))
        return EXIT_USAGE
    except typer.Abort:
        interrupted()
        return EXIT_INTERRUPTED
    except (KeyboardInterrupt, _CarriedInterrupt) as e:
        if debug:
            raise (e.__cause__ or e) from None
        interrupted()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit as e:
        # typer answers a closed stdout (`localchat models | head -1`) with exit 1 (click's
        # standalone habit); a closed pipe ends every command alike: quietly, 141
        if broken_pipe(e.__context__):
            silence_stdout()
            return EXIT_BROKEN_PIPE
        raise
    except LocalchatError as e:
        if debug:
            raise
        error(with_misread_prompt(args, str(e) or type(e).__name__))
        return int(getattr(e, "exit_code", EXIT_RUNTIME))  # e.g. a refused --draft: 2
    except Exception as e:  # the last line of defence: never a bare traceback
        if debug:
            raise
        said = output_error(e)
        if said is not None:  # `localchat models > /dev/full`
            silence_stdout()
            error(said)
            return EXIT_RUNTIME
        error(f"internal error: {e!r}; rerun with --debug")
        return EXIT_RUNTIME


def guarded(fn: Callable[[], Any], say: bool = True) -> Any:
    """Call ``fn`` (a model load), turning KeyboardInterrupt into exit 128 + the signal that
    raised it (130 for Ctrl+C, 143 for SIGTERM, 129 for SIGHUP: ``interrupts.loading_signal``),
    with the ``interrupted`` line on stderr unless ``say`` is false (the caller says what it
    kept)."""
    from localchat.app import interrupts

    try:
        return fn()
    except KeyboardInterrupt:
        signum = interrupts.loading_signal()
        if say:
            interrupted(signum=signum)
        raise typer.Exit(128 + signum) from None


def _usage_message(e: Any) -> str:
    msg = one_line(e.format_message())
    if e.ctx is not None:
        if e.ctx.command.name == "ask":
            msg += _ask_hint(e, msg)
        msg += f" (see '{e.ctx.command_path} --help')"
    return msg


def _ask_hint(e: Any, msg: str) -> str:
    """What to do instead, for the usage errors a prompt causes: words of an unquoted prompt
    (quote it), a prompt that starts with ``-`` read as an unknown option (put it after
    ``--``), and options written after ``--`` (words there, which click would otherwise have
    read as options: put them first). '' for any other error."""
    if isinstance(e, click_exc.NoSuchOption) and not e.possibilities:
        return "; a prompt that starts with '-' goes after --: localchat ask [OPTIONS] -- \"...\""
    if "unexpected extra argument" in msg:
        if any(w.startswith("-") for w in msg.rsplit("(", 1)[-1].split()):  # after --
            return "; options go before --"
        return "; quote a prompt of several words: localchat ask \"...\""
    return ""


def _err_write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _tolerant_streams() -> None:
    """Never crash on an unencodable character: replace it (e.g. an ASCII-only locale); a
    closed stdout (None) becomes ``ClosedStdout``."""
    if sys.stdout is None:
        sys.stdout = ClosedStdout()
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass
