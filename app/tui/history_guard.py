"""The TUI's history behind a guard: a failing ``history.db`` never takes the chat down.

``HistoryGuard`` wraps the ``TuiStore`` (or nothing, when the file could not be opened) and
forwards every call. The first failure of the history itself (SQLite's "database disk image is
malformed", "attempt to write a readonly database", a full disk: ``sqlite3.Error``,
``OSError``, the store's ``HistoryUnavailable`` where it exists) switches it to *unavailable*:
``problem`` names the file and what went wrong, ``on_failure`` is called once (the chat screen
shows a persistent banner), writes stop reaching the file and return in-memory stand-ins (a
conversation id ``mem-…``, messages with ``id`` None), and reads that fail return nothing. The
conversation itself lives on in the screen's ``ConversationState``, and the export action
writes it from memory. A conversation deleted by another process (``localchat history rm``,
another TUI) while it is open is *lost*: its writes raise ``ConversationNotFoundError`` in the
store, here they go to memory as above, for that conversation only, and ``on_lost`` is called
once with its id (the app says so). Other logic errors (a bad role) pass through unchanged.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localchat.app import store as store_module
from localchat.app.store import Conversation, Message, make_title
from localchat.engine.errors import LocalchatError

logger = logging.getLogger(__name__)

MEMORY_PREFIX = "mem-"


def history_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the history file is unusable"."""
    extra = getattr(store_module, "HistoryUnavailable", None)
    return (sqlite3.Error, OSError) + ((extra,) if isinstance(extra, type) else ())


def open_tui_store(path: str | Path | None = None) -> HistoryGuard:
    """The user's history (``TuiStore`` on ``path``, default ``history.db``), guarded; a file
    that cannot be opened gives a guard that is unavailable from the start."""
    from localchat.app.tui.history import TuiStore

    try:
        return HistoryGuard(TuiStore(path))
    except (LocalchatError, *history_errors()) as exc:
        where = path if path is not None else store_module.default_path()
        guard = HistoryGuard(None, path=where)
        guard.fail(exc)
        return guard


class HistoryGuard:
    """A ``TuiStore`` whose history failures turn into an in-memory mode (see the module).

    Args:
        store: the store to forward to (None: the history could not be opened).
        path: the history file, for messages (default: ``store.path``).
        on_failure: called with ``problem`` the first time the history fails (may be set
            later; a failure before it is set is reported when it is set).
    """

    def __init__(self, store: Any, *, path: str | Path | None = None,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self._store = store
        self.path = path if path is not None else getattr(store, "path", None)
        self.problem: str | None = None
        self._on_failure = on_failure
        self.lost: set[str] = set()  # conversations deleted elsewhere while open
        self.on_lost: Callable[[str], None] | None = None

    # -- state ---------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self.problem is None and self._store is not None

    @property
    def on_failure(self) -> Callable[[str], None] | None:
        return self._on_failure

    @on_failure.setter
    def on_failure(self, callback: Callable[[str], None] | None) -> None:
        self._on_failure = callback
        if callback is not None and self.problem is not None:
            callback(self.problem)

    def fail(self, exc: BaseException) -> None:
        """Switch to the in-memory mode because of ``exc`` (reported once)."""
        if self.problem is not None:
            return
        logger.debug("history failed", exc_info=exc)
        detail = str(exc) or type(exc).__name__
        where = f" {self.path}" if self.path and str(self.path) not in detail else ""
        self.problem = f"history{where}: {detail}"
        if self._on_failure is not None:
            self._on_failure(self.problem)

    def _call(self, name: str, *args: Any, fallback: Callable[[], Any], **kwargs: Any) -> Any:
        if self.available:
            try:
                return getattr(self._store, name)(*args, **kwargs)
            except history_errors() as exc:
                self.fail(exc)
        return fallback()

    def _write_to(self, conversation_id: str, name: str, *args: Any,
                  fallback: Callable[[], Any], **kwargs: Any) -> Any:
        """A write to one conversation: to memory when it is one, or was deleted elsewhere
        (found so now: ``on_lost`` once)."""
        if conversation_id.startswith(MEMORY_PREFIX) or conversation_id in self.lost:
            return fallback()
        try:
            return self._call(name, conversation_id, *args, fallback=fallback, **kwargs)
        except store_module.ConversationNotFoundError:
            self.lost.add(conversation_id)
            if self.on_lost is not None:
                self.on_lost(conversation_id)
            return fallback()

    def _read(self, name: str, *args: Any, fallback: Callable[[], Any], **kwargs: Any) -> Any:
        """Reads keep working on a read-only file: tried whenever a store is open."""
        if self._store is not None:
            try:
                return getattr(self._store, name)(*args, **kwargs)
            except history_errors() as exc:
                self.fail(exc)
        return fallback()

    # -- writes --------------------------------------------------------------------------------

    def create_conversation(self, model: str | None = None, system_prompt: str | None = None,
                            sampling: dict[str, Any] | None = None, title: str = ""
                            ) -> Conversation:
        def memory() -> Conversation:
            now = time.time()
            return Conversation(MEMORY_PREFIX + uuid.uuid4().hex[:12], title, model,
                                system_prompt, dict(sampling or {}), now, now)

        return self._call("create_conversation", model, system_prompt, sampling, title=title,
                          fallback=memory)

    def add_message(self, conversation_id: str, role: str, content: str, *,
                    interrupted: bool = False, stats: dict[str, Any] | None = None) -> Message:
        def memory() -> Message:
            return Message(None, conversation_id, role, content,  # type: ignore[arg-type]
                           time.time(), interrupted, stats)

        return self._write_to(conversation_id, "add_message", role, content,
                              interrupted=interrupted, stats=stats, fallback=memory)

    def update_conversation(self, conversation_id: str, **fields: Any) -> None:
        self._write_to(conversation_id, "update_conversation", fallback=lambda: None, **fields)

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        self._write_to(conversation_id, "rename_conversation", title, fallback=lambda: None)

    def delete_conversation(self, conversation_id: str) -> None:
        self._write_to(conversation_id, "delete_conversation", fallback=lambda: None)

    def delete_messages_from(self, conversation_id: str, message_id: int) -> int:
        return self._write_to(conversation_id, "delete_messages_from", message_id,
                              fallback=lambda: 0)

    # -- reads ---------------------------------------------------------------------------------

    def list_conversations(self, limit: int | None = None) -> list[Conversation]:
        return self._read("list_conversations", limit=limit, fallback=list)

    def search(self, query: str, limit: int = 50) -> list[Any]:
        return self._read("search", query, limit=limit, fallback=list)

    def get_conversation(self, conversation_id: str, *, with_messages: bool = True
                         ) -> Conversation:
        """As ``Store.get_conversation``.

        Raises:
            LocalchatError: the conversation is only in memory, or the history failed.
        """
        def unavailable() -> Conversation:
            raise LocalchatError(f"this conversation is not in the history ({self.problem})"
                                 if self.problem else "this conversation is not saved")

        if conversation_id.startswith(MEMORY_PREFIX):
            return unavailable()
        return self._read("get_conversation", conversation_id, with_messages=with_messages,
                          fallback=unavailable)

    def __getattr__(self, name: str) -> Any:
        """Everything else (``export_markdown``, ``fts``, ``close``, ...) as the store has it.

        Raises:
            AttributeError: no store is open (``problem`` says why).
        """
        store = self.__dict__.get("_store")
        if store is None:
            raise AttributeError(f"{name}: no history store is open")
        return getattr(store, name)


def title_for(messages: list[Any]) -> str:
    """The title the store would give a conversation: from its first user message."""
    first = next((m.content for m in messages if m.role == "user"), "")
    return make_title(first)
