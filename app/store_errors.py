"""The history store's two errors, and the decorator that keeps every other failure inside them.

``HistoryUnavailable`` is the one error a ``Store`` method lets a SQLite or OS failure become
(a corrupt file, a read-only folder, a full disk, a lock held too long); callers that can go on
without saving catch it (see ``store.py``). ``ConversationNotFoundError`` is a bad id or prefix.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from localchat.engine.errors import LocalchatError

__all__ = ["ConversationNotFoundError", "HistoryUnavailable", "raises_history_unavailable"]


class ConversationNotFoundError(LocalchatError):
    """No conversation has this id (or id prefix), or the prefix names several."""


class HistoryUnavailable(LocalchatError):
    """The history file cannot be read or written: corrupt, read-only, disk full, locked.

    Attributes:
        path: the database file (``Path``; ``":memory:"`` for an in-memory store).
        reason: SQLite's or the OS's words, e.g. ``database disk image is malformed``.

    ``str(exc)`` is one line for users: the file, the reason and what to do about it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = path if str(path) == ":memory:" else Path(path)
        self.reason = reason
        super().__init__(
            f"history {self.path} cannot be used ({reason}); move the file aside, or run "
            "'localchat history check' and 'localchat history repair'")


_F = TypeVar("_F", bound=Callable[..., Any])


def raises_history_unavailable(method: _F) -> _F:
    """Decorate a ``Store`` method: ``sqlite3.Error`` and ``OSError`` it raises become
    ``HistoryUnavailable(self.path, reason)`` (``ConversationNotFoundError`` and ``ValueError``
    pass through)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise HistoryUnavailable(self.path, str(exc) or type(exc).__name__) from exc

    return wrapper  # type: ignore[return-value]
