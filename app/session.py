"""A conversation, independent of any user interface.

``ChatSession`` holds the system prompt and the user/assistant turns, and renders the whole
conversation with the model's chat template into prompt token ids (the first step of a chat
turn, README, Architecture). The CLI's ``ask`` builds a one-turn session; the TUI keeps one per
conversation and renders it again every turn, so the engine's prefix cache can reuse the earlier
turns.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from localchat.engine.errors import ContextLengthError

ROLES = ("system", "user", "assistant")
# Reply room reserved when fitting a conversation into the context: the request's max_tokens,
# or this when max_tokens is None (run to the context end); never more than half the context.
DEFAULT_REPLY_RESERVE = 512


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
    #: Earlier user+assistant turns left out by the last ``to_prompt_token_ids`` call to fit
    #: ``max_prompt_tokens`` (0 when everything fit or no limit was given).
    last_dropped_turns: int = field(default=0, init=False, compare=False)

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
        self,
        tokenizer: ChatTemplateTokenizer,
        max_prompt_tokens: int | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Render the conversation with the tokenizer's chat template into prompt token ids.

        ``add_generation_prompt`` appends the template's assistant header so the model answers.
        Accepts tokenizers whose ``apply_chat_template`` returns a list of ids or a mapping
        with ``input_ids`` (a raw transformers tokenizer).

        Context overflow: with ``max_prompt_tokens``, when the whole conversation renders to
        more tokens than that, the oldest turns (a user message with the assistant replies that
        follow it) are left out whole, oldest first, until it fits. The system prompt and the
        latest user message (with anything after it) are always kept. The stored messages are
        not changed; ``last_dropped_turns`` records how many turns were left out. The template
        is rendered at most ``2 + log2(turns)`` times (a binary search on the number dropped).

        Raises:
            ValueError: the conversation has no message to render.
            ContextLengthError: the system prompt plus the latest user message alone render
                to more than ``max_prompt_tokens`` tokens.
        """
        self.last_dropped_turns = 0
        messages = self.to_messages()
        if not messages:
            raise ValueError("the conversation is empty: add a user message first")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")

        def render(drop: int) -> list[int]:
            kept = head + [m for turn in turns[drop:] for m in turn] + tail
            return _render_ids(tokenizer, kept, add_generation_prompt)

        head = messages[: len(messages) - len(self.messages)]  # the system message, if any
        turns, tail = _split_turns([dict(m) for m in self.messages])
        what = "the system prompt plus the latest message take" if head else (
            "the latest message takes")
        if max_prompt_tokens is not None:
            far = _far_too_long(tokenizer, head + tail, max_prompt_tokens,
                                add_generation_prompt)
            if far is not None:
                at_least, about = far
                raise ContextLengthError(
                    f"{what} more than {at_least} tokens, more than the {max_prompt_tokens} "
                    f"available for the prompt; shorten it (about {about:,} tokens in all, at "
                    "the rate of the part measured)")
        ids = render(0)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            return ids
        minimal = render(len(turns)) if turns else ids
        if len(minimal) > max_prompt_tokens:
            raise ContextLengthError(
                f"{what} {len(minimal)} tokens in the chat template, more than the "
                f"{max_prompt_tokens} available for the prompt; shorten it"
            )
        lo, hi, best = 1, len(turns), minimal  # render(hi) fits, render(lo - 1) does not
        while lo < hi:
            mid = (lo + hi) // 2
            candidate = render(mid)
            if len(candidate) <= max_prompt_tokens:
                hi, best = mid, candidate
            else:
                lo = mid + 1
        self.last_dropped_turns = hi
        return best

    def clear(self) -> None:
        """Forget every turn; the system prompt stays."""
        self.messages.clear()

    def _append(self, role: str, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"message content must be str, got {type(text).__name__}")
        self.messages.append({"role": role, "content": text})


def _split_turns(
    messages: list[dict[str, str]],
) -> tuple[list[list[dict[str, str]]], list[dict[str, str]]]:
    """Split turns into droppable groups and the protected tail.

    The tail runs from the latest user message to the end; every earlier group starts at a user
    message and holds the assistant replies after it (a leading assistant message with no user
    message before it is a group of its own). Dropping groups from the front therefore never
    splits a user+assistant pair.
    """
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return [], messages
    groups: list[list[dict[str, str]]] = []
    for m in messages[:last_user]:
        if m["role"] == "user" or not groups:
            groups.append([m])
        else:
            groups[-1].append(m)
    return groups, messages[last_user:]


# A message of more than this many characters per token of the prompt budget is measured on a
# prefix first (far_too_long); the prefix's count may exceed the whole's by a few tokens where
# the cut splits a word, hence the margin.
_PREFIX_CHARS_PER_TOKEN = 8
_PREFIX_MARGIN = 16


def _far_too_long(tokenizer: ChatTemplateTokenizer, messages: list[dict[str, str]],
                  max_prompt_tokens: int, add_generation_prompt: bool
                  ) -> tuple[int, int] | None:
    """``far_too_long`` on ``messages``' contents (those always kept: the system prompt, the
    latest user message and after), each prefix rendered alone as a user message. A pasted
    6.7 MB file was otherwise tokenized whole, several times, before being refused (32 s,
    1.7 GB for SmolLM2)."""
    def count(prefix: str) -> int:
        return len(_render_ids(tokenizer, [{"role": "user", "content": prefix}],
                               add_generation_prompt))

    return far_too_long([m["content"] for m in messages], max_prompt_tokens, count)


def far_too_long(texts: Iterable[str], max_prompt_tokens: int,
                 count: Callable[[str], int]) -> tuple[int, int] | None:
    """``(a lower bound on the prompt's tokens, an estimate of them)`` when one of ``texts``
    (parts of one prompt) is far longer than ``max_prompt_tokens`` could hold, else None,
    at a cost bounded by ``max_prompt_tokens``, not by the texts. Such a text (over
    ``8 * (max_prompt_tokens + 16)`` characters) is measured by ``count`` (its tokens as the
    prompt would hold it) on its first that many characters only (cut at a space or newline
    where there is one in the second half): the prompt holds that prefix and more, so its
    tokens, less ``_PREFIX_MARGIN``, bound the prompt's from below; the estimate scales them
    by the text's length over the prefix's. ``ask`` (``_far_too_long``) and ``localchat
    serve`` (``server/prompt_ids.py``) refuse such prompts with it."""
    cut = _PREFIX_CHARS_PER_TOKEN * (max_prompt_tokens + _PREFIX_MARGIN)
    for text in texts:
        if len(text) <= cut:
            continue
        end = max(text.rfind(" ", cut // 2, cut), text.rfind("\n", cut // 2, cut))
        prefix = text[:end if end > 0 else cut]
        n = count(prefix) - _PREFIX_MARGIN
        if n > max_prompt_tokens:
            return n, round(n * len(text) / len(prefix))
    return None


def _render_ids(
    tokenizer: ChatTemplateTokenizer, messages: list[dict[str, str]], add_generation_prompt: bool
) -> list[int]:
    ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(t) for t in ids]


def fit_prompt(session: ChatSession, tokenizer: Any, max_model_len: int,
               max_tokens: int | None) -> tuple[list[int], list[str]]:
    """Prompt token ids that leave room for the reply in the context, and notices for the
    user (CLI and TUI show them their own way).

    The rule: ``max_prompt_tokens = max_model_len - min(max_tokens or 512, max_model_len // 2)``
    (tokens). Older turns are dropped whole to fit it (``session.last_dropped_turns`` says how
    many; a notice too). When the system prompt plus the latest message alone exceed it but
    still fit the context (``< max_model_len``), they are sent as they are and the engine caps
    the reply to the room left. Template warnings (a system prompt folded into the first user
    message) become notices.

    Raises:
        ContextLengthError: the prompt leaves no room for a reply at all.
    """
    # The tokenizer module (and so torch) is imported by whoever built ``tokenizer``; a fake
    # tokenizer in tests leaves it unimported, and then no fold warning can arise.
    folded = getattr(sys.modules.get("localchat.engine.tokenizer"), "SystemPromptFoldedWarning",
                     None)
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
    notes = list(dict.fromkeys(
        " ".join(str(w.message).split()) for w in caught
        if folded is not None and issubclass(w.category, folded)))
    dropped = session.last_dropped_turns
    if dropped:
        turns = "turn" if dropped == 1 else "turns"
        notes.append(f"dropped {dropped} earlier {turns} to fit the context "
                     f"({max_model_len} tokens)")
    return ids, notes
