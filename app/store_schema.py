"""The history database's schema, row types and write transaction (used by ``store.py``).

Timestamps are Unix seconds (``time.time()``); ``sampling`` and ``stats`` are JSON text.
``messages.parent_id`` is the user message an assistant reply answers (NULL otherwise, and in
files written before it existed: ``MIGRATIONS`` adds the column). Messages are read in
``MESSAGE_ORDER``: by their turn (the parent's id for a reply, else their own), then by id, so
two processes answering one conversation at once store A, A's reply, B, B's reply whatever
order the replies finished in.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    model TEXT,
    system_prompt TEXT,
    sampling TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_updated ON conversations(updated);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    created REAL NOT NULL,
    interrupted INTEGER NOT NULL DEFAULT 0,
    stats TEXT,
    parent_id INTEGER
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages(conversation_id, id);
"""
MIGRATIONS = {"parent_id": "ALTER TABLE messages ADD COLUMN parent_id INTEGER"}
MESSAGE_ORDER = "COALESCE(parent_id, id), id"
FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id',
    tokenize='porter unicode61 remove_diacritics 2');
CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""


@dataclass
class Message:
    """One stored message. ``created`` is Unix seconds; ``stats`` is the reply's usage and
    timings (the ``--json`` ``usage``/``timings`` objects) or None."""

    id: int
    conversation_id: str
    role: str
    content: str
    created: float
    interrupted: bool = False
    stats: dict[str, Any] | None = None
    parent_id: int | None = None  # a reply's user message (replies sort right after it)


@dataclass
class Conversation:
    """One stored conversation; ``messages`` is filled by ``Store.get_conversation`` only
    (oldest first) and ``message_count`` by ``list_conversations`` and ``get_conversation``."""

    id: str
    title: str
    model: str | None
    system_prompt: str | None
    sampling: dict[str, Any]
    created: float
    updated: float
    message_count: int = 0
    messages: list[Message] = field(default_factory=list)


@dataclass
class SearchHit:
    """A message matching a search: ``snippet`` marks matched words with ``\\x02``/``\\x03``."""

    conversation_id: str
    title: str
    message_id: int
    role: str
    snippet: str
    created: float


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error): takes the write lock up front,
    so a concurrent writer waits on ``busy_timeout`` instead of failing on a lock upgrade."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def conversation_from_row(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], row["title"], row["model"], row["system_prompt"],
                        json.loads(row["sampling"] or "{}"), row["created"], row["updated"],
                        message_count=row["n"])


def message_from_row(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["conversation_id"], row["role"], row["content"],
                   row["created"], bool(row["interrupted"]),
                   json.loads(row["stats"]) if row["stats"] else None,
                   row["parent_id"] if "parent_id" in row.keys() else None)
