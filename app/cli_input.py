"""What the user gives the CLI: piped stdin, the prompt argument and every other argument,
as valid UTF-8 text (invalid bytes replaced with U+FFFD and one warning), and the prompt built
from them. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from typing import IO, Any

from localchat.app.cli_io import CliUsageError, printable, stream_isatty, warn
from localchat.engine.errors import LocalchatError


class StdinError(LocalchatError):
    """stdin could not be read (an I/O error): a runtime error, exit 1, one line."""


_STDIN_IS_A_DIRECTORY = ("stdin is a directory; redirect a file ('< FILE'), pipe text, "
                         "or pass --no-stdin")
# The most bytes of stdin read (64 MiB): some 16 million tokens of text at 4 bytes a token,
# beyond any model's context, so nothing a model could answer is refused; without a bound
# `yes | localchat ask ...` grew by 300 MB a second until the system killed it.
MAX_STDIN_BYTES = 64 << 20


def read_stdin() -> str:
    """Read stdin to EOF when it is not a terminal; '' when it is one or is absent.

    The bytes are decoded as UTF-8 with replacement; a one-line warning goes to stderr when
    any byte was invalid.

    Raises:
        CliUsageError: stdin is a directory (``localchat ask hi < some/folder``). CPython
            itself stops at startup with a fatal error on such a stdin when it runs a script,
            so this is the safety net for interpreters and launchers that let it through.
        StdinError: reading stdin failed (an I/O error): the piped text would be lost, so
            nothing is answered without it (exit 1); or stdin holds more than
            ``MAX_STDIN_BYTES`` (exit 1, after reading that much and no more).
    """
    stdin = sys.stdin
    if stdin is None or stream_isatty(stdin):
        return ""
    if _is_directory(stdin):
        raise CliUsageError(_STDIN_IS_A_DIRECTORY)
    try:
        data = _read_at_most(stdin, MAX_STDIN_BYTES + 1)
    except IsADirectoryError:
        raise CliUsageError(_STDIN_IS_A_DIRECTORY) from None
    except OSError as e:
        raise StdinError(f"cannot read stdin: {e.strerror or e}") from None
    except ValueError:  # a closed stream: nothing was piped
        return ""
    if data is None:
        raise StdinError(f"stdin holds more than {MAX_STDIN_BYTES >> 20} MiB, more text than "
                         "any model's context; cut it first (e.g. with 'head -c 1000000')")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warn("stdin is not valid UTF-8; invalid bytes were replaced with U+FFFD")
        return data.decode("utf-8", errors="replace")


def _read_at_most(stream: IO[Any], limit: int) -> bytes | None:
    """``stream``'s bytes to EOF, or None once ``limit`` bytes have come without an EOF
    (read in 1 MiB pieces, so a refused stdin never holds more than ``limit`` bytes)."""
    read = stream.buffer.read if hasattr(stream, "buffer") else (
        lambda n: stream.read(n).encode())
    pieces, total = [], 0
    while piece := read(1 << 20):
        pieces.append(piece)
        total += len(piece)
        if total >= limit:
            return None
    return b"".join(pieces)


def _is_directory(stream: IO[Any]) -> bool:
    """True when ``stream``'s file descriptor is a directory (False when it has none)."""
    try:
        return stat.S_ISDIR(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def valid_utf8(text: str | None, what: str) -> str | None:
    """``text`` with bytes that were not valid UTF-8 replaced by U+FFFD, warning once
    (``what`` names it).

    Command-line arguments reach Python with such bytes as lone surrogates
    (``surrogateescape``: ``caf\\xe9`` arrives as ``'caf\\udce9'``), which no tokenizer takes;
    stdin gets the same treatment in ``read_stdin``.
    """
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        warn(f"{what} is not valid UTF-8; invalid bytes were replaced with U+FFFD")
        return _replaced(text)


def _replaced(text: str) -> str:
    """``text`` (lone surrogates from ``surrogateescape``, or any other) as valid UTF-8 text,
    every invalid byte or surrogate replaced by U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace") \
        .encode("utf-8", "replace").decode("utf-8")


def valid_argument(arg: str) -> str:
    """A command-line argument with bytes that were not valid UTF-8 replaced by U+FFFD (a
    warning names it): every argument, not only the prompt, reaches tokenizers, the history
    database and config.toml, which take no lone surrogates (``-s $'sys\\xff'`` was an
    internal error)."""
    try:
        arg.encode("utf-8")
        return arg
    except UnicodeEncodeError:
        fixed = _replaced(arg)
        shown = printable(fixed if len(fixed) <= 40 else fixed[:39] + "\u2026")
        warn(f"the argument '{shown}' is not valid UTF-8; invalid bytes were replaced with "
             "U+FFFD")
        return fixed


def build_prompt(argument: str | None, stdin_text: str | None) -> str:
    """Join stdin text and the prompt argument: stdin first, then a blank line, then the argument.

    Trailing whitespace of each part is dropped, so ``echo X | ask Y`` equals ``ask "X\\n\\nY"``.
    ``stdin_text`` None: stdin was not read (``--no-stdin``), as the error then says.

    Raises:
        CliUsageError: both parts are empty or whitespace only.
    """
    parts = [p.rstrip() for p in (stdin_text, argument or "") if p and p.strip()]
    if not parts:
        how = "pass PROMPT (--no-stdin leaves stdin unread)" if stdin_text is None else \
            "pass PROMPT or pipe text on stdin"
        raise CliUsageError(f"no prompt: {how} (see 'localchat ask --help')")
    return "\n\n".join(parts)
