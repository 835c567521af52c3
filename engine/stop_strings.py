"""Stop strings over a stream of text deltas.

``StopStringMatcher(stops)`` consumes the text deltas of one reply and returns what may be
shown now. The contract, for the whole text ``T`` fed (all deltas concatenated, however split):

- **Output**: the concatenated emitted text (``feed`` results plus ``flush()``) equals
  ``T[:p]`` where ``p`` is the start of the earliest occurrence in ``T`` of any stop string
  (``min(T.find(s) for s in stops if s in T)``), or all of ``T`` when no stop occurs. The
  stop string never appears in the output, and neither does anything after it. This holds
  for a stop inside one delta, spanning several deltas, and whichever stop is listed first.
- **Which stop**: ``matched`` is the stop string whose occurrence starts at ``p``; when
  several start there, the shortest (it is the one that completes first).
- **Hold-back**: text that might be the start of a stop string is held back and released as
  soon as it cannot be. At any time the held text is a proper prefix of some stop ``s``, so
  at most ``len(s) - 1 <= max(len(stop)) - 1`` characters are held.
- **When a match is reported**: as soon as it is certain. A completed occurrence of a stop
  that lies *inside* a longer stop (``"bc"`` in ``"abcd"``) is reported only once the
  longer one, which would start earlier, can no longer complete; until then ``feed`` returns
  ``matched=None`` and keeps the text from the earliest possible start on held. ``flush()``
  resolves such a pending match: the shorter one wins.
- ``flush()`` ends the stream (generation ended for another reason): it releases the held
  text and, for a pending match, sets ``matched``. After a match or a flush, ``feed`` returns
  ``("", matched)`` and ignores its input.

Cost: O(len(delta) + max(len(stop))) per ``feed`` (an Aho-Corasick automaton over the stops,
one transition per character; the held buffer is bounded by the longest stop).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class StopStringMatcher:
    """Finds stop strings in a stream of text deltas; see the module docstring for the contract.

    Args:
        stops: the stop strings (order does not matter; duplicates are ignored).

    Raises:
        ValueError: a stop is empty or not a ``str``.

    Attributes:
        matched: the stop string that ended the text, or ``None``.
        finished: ``True`` after a match was reported or after ``flush()``.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            stops = (stops,)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r}")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stops))
        self.max_stop_len = max((len(s) for s in self.stops), default=0)
        self.matched: str | None = None
        self.finished = False
        self._build()
        self._state = 0
        self._pos = 0  # characters consumed so far
        self._buf = ""  # consumed, not yet emitted text; starts at absolute index _buf_start
        self._buf_start = 0
        self._match_start: int | None = None  # absolute start of the best completed match
        self._match_stop: str | None = None

    # ------------------------------------------------------------------ automaton
    def _build(self) -> None:
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        terminal: list[str | None] = [None]
        for s in self.stops:
            node = 0
            for ch in s:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    terminal.append(None)
                node = nxt
            terminal[node] = s
        n = len(goto)
        fail = [0] * n
        # best[node]: the longest stop that is a suffix of node's string (earliest start).
        best: list[str | None] = [None] * n
        # live[node]: depth of the longest suffix of node's string that a further character
        # could extend into a longer stop (a trie node with children).
        live = [0] * n
        order = deque([0])
        while order:
            node = order.popleft()
            if node:
                f = fail[node]
                best[node] = terminal[node] or best[f]
                live[node] = depth[node] if goto[node] else live[f]
            for ch, child in goto[node].items():
                if node:
                    f = fail[node]
                    while f and ch not in goto[f]:
                        f = fail[f]
                    fail[child] = goto[f].get(ch, 0)
                order.append(child)
        self._goto, self._fail, self._best, self._live = goto, fail, best, live

    def _next(self, state: int, ch: str) -> int:
        goto, fail = self._goto, self._fail
        while True:
            nxt = goto[state].get(ch)
            if nxt is not None:
                return nxt
            if state == 0:
                return 0
            state = fail[state]

    # ------------------------------------------------------------------ streaming
    def feed(self, delta: str) -> tuple[str, str | None]:
        """Consume ``delta``; return ``(emit_text, matched_stop)``.

        ``emit_text`` is the text now known to precede any stop (may be ""); ``matched_stop``
        is the stop string once a match is certain (the stream is then finished), else None.
        """
        if self.finished:
            return "", self.matched
        if not self.stops:
            return delta, None
        self._buf += delta
        state, pos = self._state, self._pos
        best, live = self._best, self._live
        done = False
        for ch in delta:
            state = self._next(state, ch)
            pos += 1
            stop = best[state]
            if stop is not None:
                start = pos - len(stop)
                if self._match_start is None or start < self._match_start:
                    self._match_start, self._match_stop = start, stop
            if self._match_start is not None and pos - live[state] >= self._match_start:
                done = True  # no longer stop can start before the match: it is final
                break
        self._state, self._pos = state, pos
        if done:
            return self._finish()
        hold_from = pos - live[state]  # earliest start of a stop still in progress
        return self._release(hold_from), None

    def flush(self) -> str:
        """End of the stream: return the held text (cut at a pending match). Idempotent."""
        if self.finished:
            return ""
        if self._match_start is not None:
            return self._finish()[0]
        self.finished = True
        return self._release(self._pos)

    @property
    def held(self) -> str:
        """The text consumed but not yet emitted."""
        return "" if self.finished else self._buf

    # ------------------------------------------------------------------ internals
    def _release(self, upto: int) -> str:
        """Emit the buffered text before absolute index ``upto``."""
        n = upto - self._buf_start
        if n <= 0:
            return ""
        out, self._buf = self._buf[:n], self._buf[n:]
        self._buf_start = upto
        return out

    def _finish(self) -> tuple[str, str | None]:
        assert self._match_start is not None
        out = self._release(self._match_start)
        self._buf = ""
        self.matched = self._match_stop
        self.finished = True
        return out, self.matched
