"""The legacy ``text_offset`` of a completion's logprobs: for each token, the character offset
in the returned text where that token's text starts (OpenAI's legacy completions object).

Adding up the lengths of the token strings does not give it: a token holding part of a
multi-byte character decodes alone to U+FFFD (a 16-character emoji text got offsets up to 31),
and a stop string cuts the text short of the tokens (an 11-character text got an offset of
13). vLLM adds those lengths (``serving_completion``) and shares the defect. Here token i
starts after the whole characters that tokens 0..i-1 decode to (``decode(ids[:i])`` less an
incomplete last character), so the bytes of one character all start where that character
starts; offsets never decrease and never pass the text returned so far. Decoding uses the
detokenizer's offset method (``engine/detokenizer.py``): a short window from the last
character boundary, not all the ids, per token.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class TextOffsets:
    """Offsets of one completion's tokens, fed in order across calls (a stream's chunks, or
    a whole body at once); ``tokenizer`` is the engine's ``Tokenizer``."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._context: list[int] = []  # ids of the last window that ended on a boundary
        self._pending: list[int] = []  # ids after it
        self._chars = 0  # characters decoded before ``_pending``
        self._next = 0  # where the next token starts

    def take(self, token_ids: list[int], text_length: int) -> list[int]:
        """The offsets of the next ``token_ids``, none past ``text_length`` (the characters
        of the completion returned so far, these tokens' text included)."""
        offsets = []
        for token_id in token_ids:
            offsets.append(min(self._next, text_length))
            self._pending.append(int(token_id))
            prefix = self._decode(self._context)
            added = self._decode(self._context + self._pending)[len(prefix):]
            self._next = self._chars + len(added.rstrip(_REPLACEMENT))
            if not added.endswith(_REPLACEMENT):  # a character boundary: a new window
                self._chars += len(added)
                self._context, self._pending = self._pending, []
        return offsets

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
