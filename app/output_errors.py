"""stdout that goes away or refuses text: the errors ``run_cli`` and ``ask`` tell apart.

A closed pipe (EPIPE: ``| head``) ends a command quietly with 141; a write that fails for the
medium's sake (a full disk, an I/O error, a descriptor closed with ``>&-``) is one line,
``cannot write to standard output: ...``, exit 1 (``ask`` keeps the reply so far first).
Nothing here imports torch.
"""

from __future__ import annotations

import errno
import io
import os
import sys

from localchat.engine.errors import LocalchatError


class StdoutError(LocalchatError):
    """stdout refused what was written (a full disk, an I/O error; not a closed pipe, which
    ends the command quietly with 141): a runtime error, exit 1, one line."""


# errno values of a write that failed for the medium's sake, not the program's: a file
# system full or over quota, a file too large, an I/O error, a device gone, stdout closed
# (``>&-``: ``ClosedStdout``)
_OUTPUT_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG", "EIO",
                                                       "ENXIO", "EBADF") if hasattr(errno, n))


class ClosedStdout(io.TextIOBase):
    """``sys.stdout`` when the process started with file descriptor 1 closed (``>&-``), where
    Python leaves it None: a write fails as writing to a closed descriptor does (EBADF), so
    the command says it cannot write instead of crashing on None or printing nowhere."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "it is closed")

    def isatty(self) -> bool:
        return False


def output_error(exc: BaseException) -> str | None:
    """The line to say when ``exc`` is a failed write to stdout (an ``OSError`` without a
    file name whose errno is a medium's: ENOSPC, EDQUOT, EFBIG, EIO, ENXIO, EBADF), else
    None."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno in _OUTPUT_ERRNOS:
        return f"cannot write to standard output: {exc.strerror or exc}"
    return None


def broken_pipe(exc: BaseException | None) -> bool:
    """True when ``exc`` is a write to a closed pipe (EPIPE)."""
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
