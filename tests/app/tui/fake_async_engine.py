"""A controllable fake of ``AsyncLLMEngine`` for TUI tests.

``GatedEngine.generate`` has the real async API (``prompt_token_ids, sampling_params,
request_id``) and yields ``RequestOutput``s, one per scripted delta, each only after the test
lets it through (``release(n)``, or ``open_gate()`` for all), so tests wait on conditions,
never on sleeps. Closing the iterator early records an abort, as the real engine does.
``num_cached_tokens`` mimics the prefix cache: the longest prefix shared with any earlier
prompt, rounded down to whole blocks of ``BLOCK_SIZE`` tokens.
"""

from __future__ import annotations

import asyncio
import time

from localchat.engine.outputs import EngineInfo, EngineStats, RequestMetrics, RequestOutput
from localchat.engine.request import FinishReason
from tests.app.fake_engine import CharTokenizer, fake_info

BLOCK_SIZE = 16


class StepClock:
    """A deterministic clock for snapshots: each call returns ``step`` seconds more."""

    def __init__(self, step: float = 0.125) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class GatedEngine:
    """Replies with ``replies[i]`` (a list of text deltas) for the i-th request; later
    requests get ``default``. ``gated=False`` streams without waiting; ``fail_with`` is raised
    at the first iteration (as the real engine raises ``add_request`` errors); ``clock``
    replaces ``time.perf_counter`` for the metrics."""

    def __init__(self, replies=(), *, default=("ok",), gated: bool = True,
                 max_model_len: int = 4096, fail_with: BaseException | None = None,
                 clock=None) -> None:
        self.tokenizer = CharTokenizer()
        self.max_model_len = max_model_len
        self.replies = [list(r) for r in replies]
        self.default = list(default)
        self.gated = gated
        self.fail_with = fail_with
        self.clock = clock or time.perf_counter
        self.calls: list[dict] = []
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.emitted = 0
        self.running = 0
        self._permits: asyncio.Semaphore | None = None
        self.shut_down = False

    # -- test controls ----------------------------------------------------------------------

    def _sem(self) -> asyncio.Semaphore:
        if self._permits is None:
            self._permits = asyncio.Semaphore(0)
        return self._permits

    def release(self, n: int = 1) -> None:
        """Let ``n`` more deltas through (across all requests)."""
        for _ in range(n):
            self._sem().release()

    def open_gate(self) -> None:
        """Stream every remaining delta without waiting."""
        self.gated = False
        self.release(10_000)

    # -- the engine API ---------------------------------------------------------------------

    async def generate(self, prompt_token_ids, sampling_params, request_id=None):
        rid = request_id or f"fake-{len(self.calls)}"
        ids = list(prompt_token_ids)
        cached = max((_shared_blocks(ids, c["ids"]) for c in self.calls), default=0)
        self.calls.append({"ids": ids, "sampling": sampling_params, "request_id": rid})
        if self.fail_with is not None:
            raise self.fail_with
        deltas = self.replies.pop(0) if self.replies else list(self.default)
        metrics = RequestMetrics(arrival_time=self.clock(), num_prompt_tokens=len(ids),
                                 num_cached_tokens=cached)
        self.running += 1
        text, done = "", False
        try:
            for i, delta in enumerate(deltas):
                if self.gated:
                    await self._sem().acquire()
                now = self.clock()
                metrics.first_scheduled_time = metrics.first_scheduled_time or now
                metrics.first_token_time = metrics.first_token_time or now
                metrics.last_token_time = now
                metrics.num_output_tokens = i + 1
                text += delta
                last = i == len(deltas) - 1
                self.emitted += 1
                yield RequestOutput(rid, [i], delta, text, len(ids), i + 1, finished=last,
                                    finish_reason=FinishReason.STOP if last else None,
                                    metrics=metrics, num_cached_tokens=cached)
            done = True
        finally:
            self.running -= 1
            (self.finished if done else self.aborted).append(rid)

    def get_info(self) -> EngineInfo:
        return fake_info(self.max_model_len, block_size=BLOCK_SIZE)

    def get_stats(self) -> EngineStats:
        return EngineStats(num_running=self.running, num_waiting=0, num_blocks=64,
                           block_size=BLOCK_SIZE, kv_cache_usage=min(1.0, self.running / 4),
                           prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0,
                           max_model_len=self.max_model_len)

    def shutdown(self, timeout: float = 10.0) -> None:
        self.shut_down = True


def _shared_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n // BLOCK_SIZE * BLOCK_SIZE
