"""Full-text search over the history's messages: FTS5 when SQLite has it, else ``LIKE``.

Used by ``Store.search`` (and ``escape_like`` by ``Store.resolve_id``). With FTS5 each word is
matched whole through the ``messages_fts`` index (porter stemming: ``dragons`` finds
``dragon``), quoted so FTS5 syntax in the query is taken literally; without it, and for the
words the index cannot find (punctuation, emoji, part of a CJK run: ``_indexed_whole``), a
substring match per word (case-insensitive for ASCII). Every word must occur in one message;
hits come newest first.
"""

from __future__ import annotations

import sqlite3

from localchat.app.store_schema import SearchHit

__all__ = ["escape_like", "search_messages"]


def escape_like(text: str) -> str:
    """``text`` with ``\\``, ``%`` and ``_`` escaped for ``LIKE ... ESCAPE '\\'``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# Scripts written without spaces between words (CJK, kana, Hangul, Thai, Lao, Myanmar, Khmer):
# FTS5's unicode61 tokenizer indexes a whole run of them as one token, so part of a run
# (``日本`` in ``日本語``) is never found through the index.
_UNSPACED = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x2E80, 0x9FFF),
             (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0x20000, 0x3FFFF))


def _indexed_whole(word: str) -> bool:
    """Whether the FTS5 index can find ``word``: every character a letter or digit of a
    script written with spaces. Punctuation, emoji and symbols (separators to the tokenizer,
    never indexed: ``100%``, ``c++``, ``snake_case``) and unspaced scripts are matched as
    substrings instead."""
    return all(ch.isalnum() and not any(lo <= ord(ch) <= hi for lo, hi in _UNSPACED)
               for ch in word)


def search_messages(db: sqlite3.Connection, words: list[str], limit: int, *, fts: bool
                    ) -> list[SearchHit]:
    """Messages containing every one of ``words`` (non-empty), newest first, at most ``limit``.

    Args:
        db: the history connection (``row_factory = sqlite3.Row``).
        words: the query split on white space.
        fts: the ``messages_fts`` index exists (else substring ``LIKE``; the caller warns).
            Words the index cannot find take ``LIKE`` too.

    Returns ``SearchHit``s whose ``snippet`` marks matches with ``\\x02``/``\\x03`` (FTS5) or is
    the message's first 120 characters (``LIKE``). Raises ``sqlite3.Error`` from the query.
    """
    indexed = [w for w in words if _indexed_whole(w)] if fts else []
    rest = [w for w in words if w not in indexed]  # (substrings, beside the index's words)
    also = "".join(" AND m.content LIKE ? ESCAPE '\\'" for _ in rest)
    params = ["%" + escape_like(w) + "%" for w in rest]
    if indexed:
        match = " ".join('"' + w.replace('"', '""') + '"' for w in indexed)
        rows = db.execute(
            "SELECT m.id, m.conversation_id, m.role, m.created, c.title, "
            "snippet(messages_fts, 0, char(2), char(3), '…', 16) AS snip "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE messages_fts MATCH ?{also} ORDER BY m.created DESC, m.id DESC LIMIT ?",
            (match, *params, int(limit))).fetchall()
    else:  # (every word a substring: rest is words)
        like = " AND ".join("m.content LIKE ? ESCAPE '\\'" for _ in rest)
        rows = db.execute(
            "SELECT m.id, m.conversation_id, m.role, m.created, c.title, "
            "substr(m.content, 1, 120) AS snip FROM messages m "
            f"JOIN conversations c ON c.id = m.conversation_id WHERE {like} "
            "ORDER BY m.created DESC, m.id DESC LIMIT ?", (*params, int(limit))).fetchall()
    return [SearchHit(r["conversation_id"], r["title"], r["id"], r["role"], r["snip"],
                      r["created"]) for r in rows]
