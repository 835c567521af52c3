"""Conversation history in SQLite, shared by the CLI (``ask -c``, ``history``) and the TUI.

One database file, ``data_dir()/history.db`` (``LOCALCHAT_HOME/data`` in tests), opened with the
standard library's ``sqlite3`` in WAL mode so readers never block the writer. Every write is one
short ``BEGIN IMMEDIATE`` transaction and every connection waits up to ``busy_timeout`` for the
write lock, so two processes (the TUI and an ``ask``) writing at once both succeed.

Schema (timestamps are Unix seconds, ``time.time()``)::

    conversations(id TEXT PK, title, model, system_prompt, sampling JSON, created, updated)
    messages(id INTEGER PK, conversation_id -> conversations ON DELETE CASCADE,
             role 'system'|'user'|'assistant', content, created, interrupted 0|1, stats JSON)
    messages_fts: FTS5 over messages.content (porter stemming), kept in sync by triggers

When this SQLite build has no FTS5, search falls back to ``LIKE`` (``Store.fts`` is False and
``search`` warns once). A crash or cancel mid-reply never loses the user's
message; callers commit it before generation starts (``add_message`` commits at once).

The history must never take the app down. Every ``Store`` method (and the constructor) turns a
SQLite or OS failure (a corrupt file, a read-only folder, a full disk, a lock held too long)
into ``HistoryUnavailable(path, reason)``; nothing else escapes. Callers that can go on without
saving (``ask``, the TUI) catch it, say once that the turn is not saved (``str(exc)`` names
the file and what to do), and keep the conversation in memory: ``open_store()`` returns a
working in-memory ``Store`` plus the error when the file cannot be opened, so a UI keeps one
code path (and can still export). ``localchat history check`` / ``repair`` (``store_repair``)
run SQLite's integrity check and salvage what is readable into a new file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from localchat.app.store_errors import (
    ConversationNotFoundError,
    HistoryUnavailable,
    raises_history_unavailable,
)
from localchat.app.store_schema import (
    FTS_SCHEMA,
    MESSAGE_ORDER,
    MIGRATIONS,
    SCHEMA,
    Conversation,
    Message,
    SearchHit,
    Transaction,
    conversation_from_row,
    message_from_row,
)
from localchat.app.store_search import escape_like, search_messages

__all__ = ["Conversation", "ConversationNotFoundError", "HistoryUnavailable", "Message",
           "SearchHit", "Store", "open_store"]

DB_NAME = "history.db"
BUSY_TIMEOUT_MS = 30_000
TITLE_CHARS = 60
ROLES = ("system", "user", "assistant")


def default_path() -> Path:
    """``data_dir()/history.db`` (``LOCALCHAT_HOME`` redirects it)."""
    from localchat.app.settings import data_dir

    return data_dir() / DB_NAME


def make_title(text: str) -> str:
    """A title from a message: its first non-empty line, at most ``TITLE_CHARS`` characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def open_store(path: str | Path | None = None) -> tuple[Store, HistoryUnavailable | None]:
    """The history store to use, and why it is not the file when it cannot be.

    Returns ``(Store(path), None)`` when the file opens; otherwise ``(Store(":memory:"),
    error)``: an empty in-memory store with the same API (conversations live as long as the
    process; exports work), and the ``HistoryUnavailable`` to show the user once. A method of
    either store can still raise ``HistoryUnavailable`` later (the disk fills up mid-session):
    catch it at the write, tell the user, keep the message in memory.
    """
    try:
        return Store(path), None
    except HistoryUnavailable as exc:
        return Store(":memory:"), exc


def sql_limit(limit: int | None) -> int:
    """``limit`` for SQLite's ``LIMIT ?``: -1 (no limit) for None or a number past its 64-bit
    integers (``history list -n 99999999999999999999`` was an internal error)."""
    return -1 if limit is None or limit >= 2**63 else int(limit)


class Store:
    """The history database. Use as a context manager or call ``close``.

    Args:
        path: the database file (default ``default_path()``); ``":memory:"`` for tests.
        busy_timeout_ms: how long a write waits for another process's lock, milliseconds.

    Raises:
        HistoryUnavailable: the file cannot be opened, is not a SQLite database, is corrupt
            or read-only (also raised by every method when a read or write fails later).
    """

    def __init__(self, path: str | Path | None = None, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS
                 ) -> None:
        self._db: sqlite3.Connection | None = None
        try:
            self.path = default_path() if path is None else path
        except OSError as exc:  # the data folder cannot be created
            where = getattr(exc, "filename", None) or "the data folder"
            raise HistoryUnavailable(where, exc.strerror or str(exc)) from exc
        try:
            if str(self.path) != ":memory:":  # the user's conversations: theirs alone to read
                with contextlib.suppress(FileExistsError):  # (SQLite's -wal / -shm follow)
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # Autocommit mode: transactions are explicit (``_write``), never implicit.
            self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_ms / 1000,
                                       isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._script(SCHEMA)
            self._migrate()
            self.fts = self._init_fts()
            # A corrupt file can open and still fail on its first read: find out now.
            self._db.execute("SELECT COUNT(*) FROM conversations").fetchone()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise HistoryUnavailable(self.path, str(exc) or type(exc).__name__) from None

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent; never raises)."""
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conversations -------------------------------------------------------------------------

    @raises_history_unavailable
    def create_conversation(self, model: str | None = None, system_prompt: str | None = None,
                            sampling: dict[str, Any] | None = None, title: str = ""
                            ) -> Conversation:
        """Create an empty conversation and return it (id: 12 hex digits, random)."""
        now = time.time()
        sampling_json = json.dumps(sampling or {}, sort_keys=True)
        while True:
            cid = uuid.uuid4().hex[:12]
            try:
                with self._write():
                    self._db.execute(
                        "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (cid, title, model, system_prompt, sampling_json, now, now))
                break
            except sqlite3.IntegrityError:  # pragma: no cover - a 48-bit id collision
                continue
        return self.get_conversation(cid, with_messages=False)

    @raises_history_unavailable
    def update_conversation(self, conversation_id: str, *, title: str | None = None,
                            model: str | None = None, system_prompt: str | None = None,
                            sampling: dict[str, Any] | None = None) -> None:
        """Change the given fields (None leaves a field as it is) and bump ``updated``.

        Raises:
            ConversationNotFoundError: no conversation has this id.
        """
        sets = {"title": title, "model": model, "system_prompt": system_prompt,
                "sampling": None if sampling is None else json.dumps(sampling, sort_keys=True)}
        sets = {k: v for k, v in sets.items() if v is not None}
        sets["updated"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in sets)
        with self._write():
            cur = self._db.execute(f"UPDATE conversations SET {cols} WHERE id = ?",
                                   (*sets.values(), conversation_id))
        if cur.rowcount == 0:
            raise ConversationNotFoundError(f"no conversation '{conversation_id}'")

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        """Set the title (see ``update_conversation``)."""
        self.update_conversation(conversation_id, title=title)

    @raises_history_unavailable
    def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation and its messages.

        Raises:
            ConversationNotFoundError: no conversation has this id.
        """
        with self._write():
            self._db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            cur = self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        if cur.rowcount == 0:
            raise ConversationNotFoundError(f"no conversation '{conversation_id}'")

    @raises_history_unavailable
    def delete_message(self, message_id: int) -> bool:
        """Delete one message; then its conversation too when no message is left in it (it
        was created for that message alone). Returns whether the conversation was deleted;
        a message id that does not exist deletes nothing (False)."""
        with self._write():
            row = self._db.execute("SELECT conversation_id FROM messages WHERE id = ?",
                                   (message_id,)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            left = self._db.execute("SELECT 1 FROM messages WHERE conversation_id = ? LIMIT 1",
                                    (row[0],)).fetchone()
            if left is None:
                self._db.execute("DELETE FROM conversations WHERE id = ?", (row[0],))
        return left is None

    @raises_history_unavailable
    def list_conversations(self, limit: int | None = None) -> list[Conversation]:
        """Conversations, most recently updated first (messages not loaded); ``limit`` None
        or past SQLite's 64-bit integers means all."""
        rows = self._db.execute(
            "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS n "
            "FROM conversations c ORDER BY c.updated DESC, c.rowid DESC LIMIT ?",
            (sql_limit(limit),)).fetchall()
        return [conversation_from_row(r) for r in rows]

    @raises_history_unavailable
    def most_recent(self, *, with_messages: bool = False) -> Conversation | None:
        """The most recently updated conversation with its messages, or None when empty.
        ``with_messages``: the most recent one that has a message (``ask -c``: an ``ask`` that
        could create its conversation in a damaged file but not add its message leaves an
        empty one, which has nothing to continue)."""
        if not with_messages:
            recent = self.list_conversations(limit=1)
            return self.get_conversation(recent[0].id) if recent else None
        row = self._db.execute(
            "SELECT c.id FROM conversations c WHERE EXISTS (SELECT 1 FROM messages m WHERE "
            "m.conversation_id = c.id) ORDER BY c.updated DESC, c.rowid DESC LIMIT 1").fetchone()
        return self.get_conversation(row[0]) if row else None

    @raises_history_unavailable
    def resolve_id(self, prefix: str) -> str:
        """The full id of the conversation whose id is ``prefix`` or starts with it.

        Raises:
            ConversationNotFoundError: no match, or the prefix matches several ids.
        """
        prefix = prefix.strip()
        rows = self._db.execute(
            "SELECT id FROM conversations WHERE id = ? OR id LIKE ? ESCAPE '\\' LIMIT 3",
            (prefix, escape_like(prefix) + "%")).fetchall()
        ids = [r["id"] for r in rows]
        if prefix in ids:
            return prefix
        if not prefix or not ids:
            raise ConversationNotFoundError(
                f"no conversation '{prefix}' (see 'localchat history list')")
        if len(ids) > 1:
            raise ConversationNotFoundError(f"conversation id '{prefix}' is ambiguous; "
                                            "give more characters")
        return ids[0]

    @raises_history_unavailable
    def get_conversation(self, conversation_id: str, *, with_messages: bool = True
                         ) -> Conversation:
        """A conversation by id or unique id prefix, with its messages oldest first.

        Raises:
            ConversationNotFoundError: see ``resolve_id``.
        """
        cid = self.resolve_id(conversation_id)
        row = self._db.execute(
            "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS n "
            "FROM conversations c WHERE c.id = ?", (cid,)).fetchone()
        conv = conversation_from_row(row)
        if with_messages:
            rows = self._db.execute(
                f"SELECT * FROM messages WHERE conversation_id = ? ORDER BY {MESSAGE_ORDER}",
                (cid,))
            conv.messages = [message_from_row(r) for r in rows]
        return conv

    # -- messages ------------------------------------------------------------------------------

    @raises_history_unavailable
    def add_message(self, conversation_id: str, role: str, content: str, *,
                    interrupted: bool = False, stats: dict[str, Any] | None = None,
                    parent_id: int | None = None) -> Message:
        """Append a message and commit it at once; the first user message sets an empty title.

        ``parent_id``: for a reply, the id of the user message it answers, so the reply is read
        back right after it even when another process added a turn in between.

        Raises:
            ValueError: ``role`` is not system, user or assistant.
            ConversationNotFoundError: no conversation has this id.
        """
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        now = time.time()
        stats_json = None if stats is None else json.dumps(stats, sort_keys=True)
        try:
            with self._write():
                cur = self._db.execute(
                    "INSERT INTO messages (conversation_id, role, content, created, interrupted,"
                    " stats, parent_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (conversation_id, role, content, now, int(interrupted), stats_json,
                     parent_id))
                title = make_title(content) if role == "user" else ""
                self._db.execute(
                    "UPDATE conversations SET updated = ?, title = CASE WHEN title = '' "
                    "THEN ? ELSE title END WHERE id = ?", (now, title, conversation_id))
        except sqlite3.IntegrityError:
            raise ConversationNotFoundError(f"no conversation '{conversation_id}'") from None
        return Message(int(cur.lastrowid), conversation_id, role, content, now,
                       interrupted, stats, parent_id)

    @raises_history_unavailable
    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Messages whose text contains every word of ``query``, newest first.

        Words are matched whole with FTS5 (porter stemming: ``dragons`` finds ``dragon``);
        FTS5 syntax in ``query`` is taken literally. Without FTS5, a case-insensitive substring
        match (``LIKE``) per word, with a warning.
        """
        words = query.split()
        if not words:
            return []
        if not self.fts:
            warnings.warn("this SQLite has no FTS5; searching by substring", stacklevel=2)
        return search_messages(self._db, words, sql_limit(limit), fts=self.fts)

    # -- export --------------------------------------------------------------------------------

    def export_json(self, conversation_id: str) -> str:
        """The conversation and its messages as one JSON document (UTF-8 text, indented)."""
        from localchat.app.history_format import to_json

        return to_json(self.get_conversation(conversation_id))

    def export_markdown(self, conversation_id: str) -> str:
        """The conversation as Markdown: a title, metadata, then one section per message."""
        from localchat.app.history_format import to_markdown

        return to_markdown(self.get_conversation(conversation_id))

    # -- internals -----------------------------------------------------------------------------

    def _write(self) -> Transaction:
        return Transaction(self._db)

    def _script(self, script: str) -> None:
        """Run a DDL script in one immediate transaction (``executescript`` would commit an
        open transaction first, so the BEGIN and COMMIT are part of the script)."""
        try:
            self._db.executescript(f"BEGIN IMMEDIATE;\n{script}\nCOMMIT;")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _migrate(self) -> None:
        """Add the columns a file written by an older localchat lacks."""
        have = {r["name"] for r in self._db.execute("PRAGMA table_info(messages)")}
        for column, ddl in MIGRATIONS.items():
            if column not in have:
                with self._write():
                    self._db.execute(ddl)

    def _init_fts(self) -> bool:
        try:
            self._script(FTS_SCHEMA)
        except sqlite3.OperationalError as exc:
            if "fts5" not in str(exc).lower():
                raise
            return False
        return True
