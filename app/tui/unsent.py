"""The prompt's unsent text, kept across a quit.

Quitting the TUI (Ctrl+Q, or any other way it exits) with text in the prompt writes that text
and the id of the conversation it was typed in to ``unsent.json`` in the data folder (beside
``history.db``); the next start reopens that conversation and puts the text back in the
prompt. A quit with an empty prompt removes the file. As with a reply that Ctrl+Q stops (kept,
saved marked interrupted), nothing the user wrote is thrown away.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FILE_NAME = "unsent.json"


@dataclass(frozen=True)
class Unsent:
    """Text typed but not sent, and the conversation it was typed in (None: a new one)."""

    text: str
    conversation_id: str | None = None


def default_path() -> Path:
    """``data_dir()/unsent.json`` (``LOCALCHAT_HOME`` redirects it)."""
    from localchat.app.settings import data_dir

    return data_dir() / FILE_NAME


def save_unsent(unsent: Unsent | None, path: Path | None = None) -> None:
    """Write ``unsent`` (replacing the file at once, never half-written), or remove the file
    when ``unsent`` is None or blank. A failure is logged, never raised: the app is exiting."""
    try:
        target = path or default_path()
        if unsent is None or not unsent.text.strip():
            target.unlink(missing_ok=True)
            return
        body = json.dumps({"text": unsent.text, "conversation_id": unsent.conversation_id})
        partial = target.with_name(target.name + ".partial")
        partial.write_text(body, encoding="utf-8")
        os.replace(partial, target)
    except Exception:  # the app is exiting: no UI left to say it in
        logger.warning("cannot keep the unsent message", exc_info=True)


def load_unsent(path: Path | None = None) -> Unsent | None:
    """The text kept by the last quit, or None (no file, or one that cannot be read)."""
    try:
        data = json.loads((path or default_path()).read_text(encoding="utf-8"))
        text, conv = data["text"], data.get("conversation_id")
    except FileNotFoundError:
        return None
    except Exception:  # a damaged file is not worth a failed start
        logger.warning("cannot read the unsent message", exc_info=True)
        return None
    if not isinstance(text, str) or not text.strip():
        return None
    return Unsent(text, conv if isinstance(conv, str) else None)
