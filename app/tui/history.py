"""The TUI's view of the shared history: ``Store`` plus truncation for regenerate and edit.

``TuiStore.delete_messages_from`` removes a message and every later one of its conversation in
one write transaction (the FTS index follows through the store's triggers), so a regenerated
reply or an edited question replaces the old one when the conversation is reopened, in the
TUI and in ``localchat ask -c`` alike.
"""

from __future__ import annotations

import time

from localchat.app.store import ConversationNotFoundError, Store


class TuiStore(Store):
    """``Store`` with ``delete_messages_from``."""

    def delete_messages_from(self, conversation_id: str, message_id: int) -> int:
        """Delete message ``message_id`` and all later messages of the conversation; returns
        how many rows went.

        Raises:
            ConversationNotFoundError: no conversation has this id.
        """
        with self._write():
            exists = self._db.execute("SELECT 1 FROM conversations WHERE id = ?",
                                      (conversation_id,)).fetchone()
            if exists is None:
                raise ConversationNotFoundError(f"no conversation '{conversation_id}'")
            cur = self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                (conversation_id, int(message_id)))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                             (time.time(), conversation_id))
        return cur.rowcount
