"""Check a history database and salvage what is readable from a damaged one.

``localchat history check`` runs SQLite's own ``PRAGMA integrity_check`` (b-tree structure,
page use, index consistency: https://sqlite.org/pragma.html#pragma_integrity_check).
``localchat history repair`` copies every row it can still read into a fresh database (one
point lookup per rowid, so a corrupt page loses only the rows stored on it), then moves the
damaged file aside as ``history.db.corrupt-<time>`` and puts the new file in its place. The
damaged file is never modified or deleted, so a repair can lose nothing that was there.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

# Rowid scans stop after this many consecutive missing rowids when max(rowid) is unreadable.
_MAX_GAP = 10_000
# The largest rowid as an index knows it (when the table's own b-tree root is unreadable).
_INDEX_MAX = {"messages": "SELECT max(id) FROM messages INDEXED BY messages_conversation",
              "conversations": "SELECT max(rowid) FROM conversations INDEXED BY "
                               "conversations_updated"}
_CONVERSATION_COLUMNS = ("id", "title", "model", "system_prompt", "sampling", "created",
                         "updated")


@dataclass(frozen=True)
class RepairResult:
    """What ``repair`` salvaged: counts of rows copied and lost, and where the files are."""

    conversations: int
    messages: int
    lost_conversations: int
    lost_messages: int
    new_path: Path
    moved_aside: Path | None


def check(path: Path) -> list[str]:
    """Problems SQLite finds in the database at ``path``; ``[]`` when it is sound.

    Opens the file read-only (a check never writes). A missing file is one problem.
    """
    if not Path(path).is_file():
        return [f"{path}: no such file"]
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return [str(exc)]
    try:
        rows = [r[0] for r in db.execute("PRAGMA integrity_check(20)").fetchall()]
        if rows == ["ok"]:
            db.execute("SELECT COUNT(*) FROM conversations").fetchone()
            return []
        return rows
    except sqlite3.Error as exc:
        return [str(exc)]
    finally:
        db.close()


def repair(path: Path, *, replace: bool = True) -> RepairResult:
    """Copy every readable conversation and message of ``path`` into a new database.

    The new file is ``<path>.recovered-<time>``; with ``replace`` the damaged file is then
    renamed ``<path>.corrupt-<time>`` and the new one takes its name. Messages whose
    conversation row is lost are kept under a conversation titled ``(recovered)``.

    Raises:
        HistoryUnavailable: the damaged file cannot be opened at all, or the new file cannot
            be written (read-only folder, full disk).
    """
    from localchat.app.store import HistoryUnavailable, Store

    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    new_path = path.with_name(f"{path.name}.recovered-{stamp}")
    try:
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        old.row_factory = sqlite3.Row
    except sqlite3.Error as exc:
        raise HistoryUnavailable(path, str(exc)) from None
    try:
        convs, lost_convs = _salvage(old, "conversations")
        msgs, lost_msgs = _salvage(old, "messages")
    finally:
        old.close()
    store = Store(new_path)
    try:
        skipped_convs, skipped_msgs = _write(store, convs, msgs)
    except sqlite3.Error as exc:
        store.close()
        new_path.unlink(missing_ok=True)
        raise HistoryUnavailable(new_path, str(exc)) from None
    store.close()
    moved = None
    if replace:
        moved = path.with_name(f"{path.name}.corrupt-{stamp}")
        try:
            os.replace(path, moved)
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    os.replace(side, moved.with_name(moved.name + suffix))
            os.replace(new_path, path)
        except OSError as exc:
            raise HistoryUnavailable(path, f"cannot swap in {new_path}: {exc.strerror}") from None
    return RepairResult(len(convs) - skipped_convs, len(msgs) - skipped_msgs,
                        lost_convs + skipped_convs, lost_msgs + skipped_msgs,
                        path if replace else new_path, moved)


def _salvage(db: sqlite3.Connection, table: str) -> tuple[list[sqlite3.Row], int]:
    """Every readable row of ``table``, one rowid lookup at a time, and how many rowids up to
    the last readable one could not be read. Up to ``max(rowid)`` when that is readable, else
    until ``_MAX_GAP`` rowids in a row give nothing."""
    top = None
    for sql in (f"SELECT max(rowid) FROM {table}", _INDEX_MAX.get(table)):
        try:
            top = db.execute(sql).fetchone()[0] if sql else None
            break
        except sqlite3.Error:
            continue
    rows: list[sqlite3.Row] = []
    lost = failed = gap = 0
    rowid = 0
    while (rowid < top) if top is not None else (gap < _MAX_GAP):
        rowid += 1
        try:
            row = db.execute(f"SELECT * FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.Error:
            failed += 1
            gap += 1
            continue
        if row is None:
            gap += 1
            continue
        rows.append(row)
        lost, failed, gap = lost + failed, 0, 0
    return rows, lost + (failed if top is not None else 0)


def _write(store, convs: list[sqlite3.Row], msgs: list[sqlite3.Row]) -> tuple[int, int]:
    """Insert the salvaged rows in one transaction; returns the rows refused as garbage
    (conversations, messages) by the schema's constraints."""
    db = store._db
    ids = set()
    skipped = [0, 0]

    def insert(kind: int, sql: str, values) -> bool:
        try:
            db.execute(sql, values)
            return True
        except (sqlite3.IntegrityError, sqlite3.InterfaceError, ValueError):
            skipped[kind] += 1
            return False

    db.execute("BEGIN IMMEDIATE")
    try:
        for row in convs:
            if insert(0, "INSERT OR IGNORE INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                      tuple(_get(row, c) for c in _CONVERSATION_COLUMNS)):
                ids.add(row["id"])
        orphan = None
        for row in msgs:
            cid = row["conversation_id"]
            if cid not in ids:
                if orphan is None:
                    orphan = "recovered0000"
                    now = time.time()
                    db.execute("INSERT OR IGNORE INTO conversations VALUES "
                               "(?, '(recovered)', NULL, NULL, '{}', ?, ?)", (orphan, now, now))
                cid = orphan
            keys = row.keys()
            cols = ["id", "conversation_id", "role", "content", "created", "interrupted",
                    "stats"] + [k for k in ("parent_id",) if k in keys]
            values = [row["id"], cid, row["role"], row["content"], row["created"],
                      row["interrupted"], row["stats"]] + [row[k] for k in cols[7:]]
            insert(1, f"INSERT OR IGNORE INTO messages ({', '.join(cols)}) VALUES "
                   f"({', '.join('?' * len(cols))})", values)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return skipped[0], skipped[1]


def _get(row: sqlite3.Row, column: str) -> object:
    return row[column] if column in row.keys() else None
