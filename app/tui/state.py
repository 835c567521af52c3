"""What the TUI knows about its conversations, independent of widgets.

``ConversationState`` mirrors one stored conversation (``app/store.py``) plus the reply being
generated for it (``Turn``). The chat screen renders a state into widgets, and a reply keeps
streaming into its own state while the user looks at another conversation. ``fit_prompt``
renders a state's ``ChatSession`` into prompt token ids under the same reserve rule as
``localchat ask`` (``app/ask_cmd.py``), returning notices instead of printing them.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any

from localchat.app.session import ChatSession
from localchat.engine.errors import ContextLengthError

# Reply room reserved when fitting the conversation into the context (tokens); as in ask.
DEFAULT_REPLY_RESERVE = 512
_request_ids = itertools.count()


@dataclass
class ChatMessage:
    """One message as shown: ``message_id`` is the store's row id (None when not saved)."""

    role: str
    content: str
    interrupted: bool = False
    stats: dict[str, Any] | None = None
    message_id: int | None = None


@dataclass
class Turn:
    """A reply being generated for conversation ``conversation_id``.

    ``text`` is the reply so far, ``last`` the latest ``RequestOutput`` (None before the first),
    ``num_prompt_tokens`` the prompt length in tokens, ``dropped_turns`` how many old turns
    were left out to fit the context. ``worker`` is the Textual worker streaming it.
    """

    conversation_id: str
    request_id: str
    num_prompt_tokens: int
    dropped_turns: int = 0
    text: str = ""
    last: Any = None
    worker: Any = None
    interrupted: bool = False
    done: bool = False


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
        """Build from a ``store.Conversation`` with its messages (system rows are skipped)."""
        msgs = [ChatMessage(m.role, m.content, m.interrupted, m.stats, m.id)
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


def new_request_id(conversation_id: str) -> str:
    """A request id unique in this process, naming the conversation (for logs)."""
    return f"tui-{conversation_id}-{next(_request_ids)}"


def fit_prompt(session: ChatSession, tokenizer: Any, max_model_len: int,
               max_tokens: int | None) -> tuple[list[int], list[str]]:
    """Prompt token ids that leave room for the reply, and notices for the user.

    ``max_prompt_tokens = max_model_len - min(max_tokens or 512, max_model_len // 2)``; older
    turns are dropped whole to fit (``session.last_dropped_turns``). A system prompt plus
    latest message too long for that but shorter than the context are sent as they are.
    Template warnings (a system prompt folded into the first user message) become notices.

    Raises:
        ContextLengthError: the latest message leaves no room for a reply at all.
    """
    reserve = min(max_tokens or DEFAULT_REPLY_RESERVE, max_model_len // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ids = session.to_prompt_token_ids(tokenizer, max_model_len - reserve)
        except ContextLengthError:
            try:
                ids = session.to_prompt_token_ids(tokenizer, max_model_len - 1)
            except ContextLengthError as err:
                raise ContextLengthError(
                    f"{err} (the context holds {max_model_len} tokens, prompt + reply)"
                ) from None
    notes = list(dict.fromkeys(" ".join(str(w.message).split()) for w in caught
                               if "fold" in w.category.__name__.lower()))
    return ids, notes
