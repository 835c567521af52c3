"""What the TUI knows about its conversations, independent of widgets.

``ConversationState`` mirrors one stored conversation (``app/store.py``) plus the reply being
generated for it (``Turn``). The chat screen renders a state into widgets, and a reply keeps
streaming into its own state while the user looks at another conversation. A state's
``ChatSession`` becomes prompt token ids through ``session.fit_prompt``, the rule
``localchat ask`` uses too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from localchat.app.session import ChatSession
from localchat.engine.outputs import RequestOutput

# Reply room reserved when fitting the conversation into the context (tokens); as in ask.
_request_ids = itertools.count()


@dataclass
class ChatMessage:
    """One message as shown: ``message_id`` is the store's row id (None when not saved),
    ``created`` its time (Unix seconds), ``model`` the model that wrote a reply."""

    role: str
    content: str
    interrupted: bool = False
    stats: dict[str, Any] | None = None
    message_id: int | None = None
    created: float | None = None
    model: str | None = None


@dataclass
class Turn:
    """A reply being generated for conversation ``conversation_id``.

    ``text`` is the reply so far, ``last`` the latest ``RequestOutput`` (None before the first),
    ``num_prompt_tokens`` the prompt length in tokens, ``dropped_turns`` how many old turns
    were left out to fit the context. ``worker`` is the Textual worker streaming it; ``model``
    the model answering and ``created`` when the turn started (Unix seconds).
    """

    conversation_id: str
    request_id: str
    num_prompt_tokens: int
    dropped_turns: int = 0
    text: str = ""
    last: RequestOutput | None = None
    worker: Any = None
    interrupted: bool = False
    done: bool = False
    model: str | None = None
    created: float | None = None


@dataclass
class ConversationState:
    """A conversation: ``id`` is None until its first message is saved (no empty rows)."""

    id: str | None = None
    title: str = ""
    model: str | None = None
    system_prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    messages: list[ChatMessage] = field(default_factory=list)
    turn: Turn | None = None

    @classmethod
    def from_stored(cls, conv: Any) -> ConversationState:
        """Build from a ``store.Conversation`` with its messages (system rows are skipped).

        A reply's model is the one its stats name (``stats["model"]``, written by the TUI),
        else the conversation's."""
        msgs = [ChatMessage(m.role, m.content, m.interrupted, m.stats, m.id, m.created,
                            _reply_model(m, conv.model))
                for m in conv.messages if m.role in ("user", "assistant")]
        return cls(conv.id, conv.title, conv.model, conv.system_prompt, dict(conv.sampling),
                   msgs)

    @property
    def streaming(self) -> bool:
        return self.turn is not None and not self.turn.done

    def session(self) -> ChatSession:
        """The conversation as a ``ChatSession`` (system prompt + turns)."""
        session = ChatSession(system=self.system_prompt or None)
        for m in self.messages:
            if m.role == "user":
                session.add_user(m.content)
            else:
                session.add_assistant(m.content)
        return session

    def last_index(self, role: str) -> int | None:
        """Index in ``messages`` of the latest message with ``role``, or None."""
        return next((i for i in range(len(self.messages) - 1, -1, -1)
                     if self.messages[i].role == role), None)


def _reply_model(message: Any, conversation_model: str | None) -> str | None:
    if message.role != "assistant":
        return None
    stats = message.stats if isinstance(message.stats, dict) else {}
    return stats.get("model") or conversation_model


def new_request_id(conversation_id: str) -> str:
    """A request id unique in this process, naming the conversation (for logs)."""
    return f"tui-{conversation_id}-{next(_request_ids)}"


