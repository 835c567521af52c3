"""Incremental ids -> text for streaming, with UTF-8 hold-back.

``IncrementalDetokenizer.step(new_ids)`` returns the text the new ids add. The invariant
(README, Architecture): the concatenated deltas plus ``flush()`` equal
``tokenizer.decode(all_ids)`` exactly, for byte-level BPE (SmolLM2, Qwen, Llama 3) and
SentencePiece with byte fallback (Llama 2, Mistral), and no delta carries a U+FFFD for a
character whose bytes are split across tokens: such a tail is held back until it completes.

How: the offset method. Each step decodes a short window, ``context + pending``, where
``context`` is the id chunk of the previous emission (it starts at a clean character boundary)
and ``pending`` the ids not yet emitted; the delta is the window's text beyond the text of
``context`` alone, held back while it ends in U+FFFD. So the cost per step is O(window), not
O(all ids), and the leading-space rules of SentencePiece decoders (which strip the first
token's space) act identically on both decodes. The ``tokenizers`` library's
``DecodeStream`` implements this same method in Rust and is used for the steps when present;
our own bookkeeping adds what it lacks: ``flush()`` of a held tail at the end of generation,
and recovery (falling back to the Python window) if it reports an inconsistent prefix.

Known limit: with SentencePiece byte fallback, a run of byte tokens that is *invalid* UTF-8 is
rendered by ``decode`` as one U+FFFD per byte for the whole run, even the valid characters
before the bad byte; text already streamed cannot be taken back, so only then can the stream
differ from the one-shot decode. Models emit valid UTF-8 in practice.

Stop strings: every delta passes through ``_emit``, which feeds a ``StopStringMatcher``
(engine/stop_strings.py) when ``stop`` is given. Then the emitted text is the decode cut
before the earliest stop string (the stop and everything after it never appear), text that
may start a stop is held back until it cannot, and ``stop_matched`` names the stop once a
match is certain; after it ``step`` returns "". The streamed deltas plus ``flush()`` still
equal ``text``, so streamed output equals non-streamed output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localchat.engine.stop_strings import StopStringMatcher
from localchat.engine.tokenizer import Tokenizer

try:  # tokenizers >= 0.21
    from tokenizers.decoders import DecodeStream
except ImportError:  # pragma: no cover - older tokenizers
    DecodeStream = None

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas for one request.

    Args:
        tokenizer: the model's ``Tokenizer``.
        skip_special_tokens: drop special tokens (``<|im_end|>``, ...) from the text, as
            ``tokenizer.decode`` does with the same flag.
        use_decode_stream: use ``tokenizers.decoders.DecodeStream`` for the steps when it is
            available (``False`` forces the pure-Python window; both give the same text).
        stop: stop strings; the text ends before the earliest one (see the module docstring).

    Raises:
        ValueError: a stop string is empty.

    Attributes:
        text: all text emitted so far (the deltas concatenated).
        num_tokens: how many ids have been fed.
        stop_matched: the stop string that ended the text, or ``None``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True,
                 *, use_decode_stream: bool = True, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self.num_tokens = 0
        self._backend: Any = tokenizer.backend
        self._context: list[int] = []  # ids of the last emitted chunk
        self._pending: list[int] = []  # ids fed but not yet turned into text
        self._stream: Any = None
        if use_decode_stream and DecodeStream is not None:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._finished = False
        self._matcher = StopStringMatcher(stop) if stop else None

    @property
    def stop_matched(self) -> str | None:
        return self._matcher.matched if self._matcher is not None else None

    def step(self, new_token_ids: list[int]) -> str:
        """Feed the newly generated ids; return the text they complete (may be "").

        Raises:
            RuntimeError: called after ``flush()``.
        """
        if self._finished:
            raise RuntimeError("step() after flush(): the detokenizer is finished")
        out = []
        for token_id in new_token_ids:  # one id at a time: text is released as early as possible
            self.num_tokens += 1
            self._pending.append(int(token_id))
            tid = int(token_id)
            delta = self._window_step() if self._stream is None else self._stream_step(tid)
            if delta is not None:
                self._context, self._pending = self._pending, []
                out.append(delta)
        return self._emit("".join(out)) if out else ""

    def flush(self, drop_incomplete: bool = False) -> str:
        """End of generation: release held text, rendered as ``decode`` renders it.

        A held tail is an incomplete UTF-8 sequence (generation stopped inside a character).
        By default it comes out as ``decode`` renders it, with U+FFFD; with
        ``drop_incomplete=True`` (the engine's choice when ``max_tokens`` or an abort cut the
        reply) trailing U+FFFD are dropped, so no broken character reaches the user.
        Text held back as a possible stop-string start is released too (cut at a stop string
        if it completes one). Idempotent.
        """
        self._finished = True
        out = ""
        if self._pending:
            prefix, full = self._window()
            self._context, self._pending = [], []
            delta = full.removeprefix(prefix)
            if drop_incomplete:
                delta = delta.rstrip(_REPLACEMENT)
            out = self._emit(delta) if delta else ""
        if self._matcher is not None:
            tail = self._matcher.flush()
            self.text += tail
            out += tail
        return out

    # ------------------------------------------------------------------ internals
    def _emit(self, delta: str) -> str:
        """Single exit for text: stop strings are matched here."""
        if self._matcher is not None:
            delta, _ = self._matcher.feed(delta)
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _window(self) -> tuple[str, str]:
        """(text of context, text of context + pending): the offset method's two decodes."""
        return self._decode(self._context), self._decode(self._context + self._pending)

    def _window_step(self) -> str | None:
        """The offset method in Python: text of context + pending beyond text of context."""
        prefix, full = self._window()
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return None
        if not full.startswith(prefix):  # cannot happen for well-formed input; be safe
            return None
        return full[len(prefix):]

    def _stream_step(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self._backend, token_id)
        except Exception:  # noqa: BLE001 - DecodeStream refused its prefix:
            self._stream = None  # continue with the Python window, which needs no history
            return self._window_step()
