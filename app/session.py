"""A conversation, independent of any user interface.

``ChatSession`` holds the system prompt and the user/assistant turns, and renders the whole
conversation with the model's chat template into prompt token ids (DESIGN.md section 3, step
1). The CLI's ``ask`` builds a one-turn session; the TUI keeps one per conversation and renders
it again every turn, so the engine's prefix cache can reuse the earlier turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ROLES = ("system", "user", "assistant")


class ChatTemplateTokenizer(Protocol):
    """What a session needs from a tokenizer: the chat template, rendered to token ids."""

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]: ...


@dataclass
class ChatSession:
    """A system prompt plus alternating user and assistant messages.

    Attributes:
        system: the system prompt, or ``None`` for the template's default behaviour.
        messages: the turns so far, each ``{"role": "user" | "assistant", "content": str}``,
            oldest first. The system prompt is kept apart and never appears here.
    """

    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def add_user(self, text: str) -> None:
        """Append a user message."""
        self._append("user", text)

    def add_assistant(self, text: str) -> None:
        """Append an assistant message (a complete or an interrupted reply)."""
        self._append("assistant", text)

    def to_messages(self) -> list[dict[str, str]]:
        """The conversation as chat-template messages: the system message first when set."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [dict(m) for m in self.messages]

    def to_prompt_token_ids(
        self, tokenizer: ChatTemplateTokenizer, *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Render the conversation with the tokenizer's chat template into prompt token ids.

        ``add_generation_prompt`` appends the template's assistant header so the model answers.
        Accepts tokenizers whose ``apply_chat_template`` returns a list of ids or a mapping
        with ``input_ids`` (a raw transformers tokenizer).

        Raises:
            ValueError: the conversation has no message to render.
        """
        messages = self.to_messages()
        if not messages:
            raise ValueError("the conversation is empty: add a user message first")
        ids: Any = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt
        )
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
        return [int(t) for t in ids]

    def clear(self) -> None:
        """Forget every turn; the system prompt stays."""
        self.messages.clear()

    def _append(self, role: str, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"message content must be str, got {type(text).__name__}")
        self.messages.append({"role": role, "content": text})
