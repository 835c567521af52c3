"""Piped text of an ``ask`` that failed before its turn was saved: kept in a file, so that
text which came down a pipe (``git diff | localchat ask ...``, a state that may be gone by the
time the user retries) is not lost to an unknown model, a corrupt file, an unreachable server
or a prompt too long for the context. The prompt argument is not kept: the shell has it.

The file is ``data_dir()/unsent/<UTC time>-<random>.txt``, readable by the user alone, holding
the piped text as decoded from stdin; the error line names it, so the retry is
``localchat ask ... < FILE``. Nothing cleans the folder: its files are the user's.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def keep_piped_text(text: str | None) -> Path | None:
    """Write ``text`` (the decoded stdin) to a new file under ``data_dir()/unsent``; its path,
    or None when there is nothing to keep (None: stdin not read; blank) or it cannot be
    written (a full disk, a read-only home: the error line that would name it is said
    without it)."""
    from localchat.app.settings import data_dir
    from localchat.engine.errors import LocalchatError

    if not text or not text.strip():
        return None
    try:
        folder = data_dir() / "unsent"
        folder.mkdir(mode=0o700, exist_ok=True)
        fd, name = tempfile.mkstemp(  # a new file, mode 0600
            prefix=time.strftime("%Y%m%d-%H%M%S-", time.gmtime()), suffix=".txt", dir=folder)
    except (OSError, LocalchatError):
        return None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
    except OSError:  # a full disk: no part-written file left behind
        Path(name).unlink(missing_ok=True)
        return None
    return Path(name)


def with_kept_text(exc: BaseException, text: str | None) -> None:
    """Append where ``text`` (piped) is kept to ``exc``'s one-line message, in place; nothing
    for no or blank text, an exception of several arguments, or a failed write."""
    if len(exc.args) != 1:
        return
    path = keep_piped_text(text)
    if path is not None:
        exc.args = (f"{exc.args[0]}; the piped text is kept in {path}",)
