"""The engine's step loop on its own thread, with one async stream per request.

``AsyncLLMEngine.generate(...)`` is an async iterator of ``RequestOutput``s: any number of
callers (a TUI, a server, several chats) stream concurrently while one thread batches their
requests through ``LLMEngine.step()``. Leaving the iterator early (``break``, task
cancellation) aborts the request and frees its KV blocks. The engine itself is touched only by
its thread: callers post commands to it through a queue, and outputs come back through each
request's ``asyncio.Queue`` (``loop.call_soon_threadsafe``). torch releases the GIL inside its
kernels, so the caller's event loop stays responsive while a step runs.
Reference design: vLLM's ``AsyncLLMEngine`` (background loop + per-request streams).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from .config import EngineConfig
from .llm_engine import LLMEngine
from .outputs import EngineInfo, EngineStats, RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            pass


class EngineDeadError(RuntimeError):
    """The engine thread has stopped (after ``shutdown`` or a fatal error)."""


class AsyncLLMEngine:
    """An ``LLMEngine`` driven by a background thread; see the module docstring.

    Build with :meth:`from_path` / :meth:`from_source`, or wrap an existing engine (the thread
    then owns it: do not call the wrapped engine directly). ``tokenizer``, ``model_config`` and
    ``max_model_len`` are the wrapped engine's.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.max_model_len = engine.max_model_len
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stats = engine.get_stats()
        self._info = engine.get_info()
        self._stopped = threading.Event()
        if engine.device.type == "cpu":
            # this thread's OpenMP team (it loaded the model) would otherwise live beside the
            # engine thread's and make libgomp put both teams' workers to sleep between
            # kernels (kernels.cpu.release_thread_pool)
            from localchat.kernels import cpu as cpu_kernels

            cpu_kernels.release_thread_pool()
        self._thread = threading.Thread(target=self._loop, name="localchat-engine",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def from_path(cls, path: Path, config: EngineConfig | None = None, *,
                  cache_dir: Path | None = None) -> AsyncLLMEngine:
        """Load like ``LLMEngine.from_path`` and start the step loop."""
        return cls(LLMEngine.from_path(path, config, cache_dir=cache_dir))

    @classmethod
    def from_source(cls, source, config: EngineConfig | None = None, *,
                    cache_dir: Path | None = None) -> AsyncLLMEngine:
        """Load a resolved ``hub.ModelSource`` and start the step loop."""
        return cls(LLMEngine.from_source(source, config, cache_dir=cache_dir))

    # -- caller side (any thread with a running event loop) ----------------------------------

    async def generate(self, prompt_token_ids: list[int], sampling_params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's ``RequestOutput``s until it finishes.

        Raises what ``LLMEngine.add_request`` raises (``ContextLengthError``, ``ValueError``)
        at the first iteration, ``EngineDeadError`` after ``shutdown``, and any error the
        engine hit while running this request. Closing or cancelling the iterator aborts it.
        """
        if self._stopped.is_set():
            raise EngineDeadError("the engine has been shut down")
        rid = request_id or f"async-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[rid] = stream
        self._commands.put(("add", rid, list(prompt_token_ids), sampling_params))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._commands.put(("abort", rid))

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its stream ends with ``finish_reason`` abort."""
        self._commands.put(("abort", request_id))

    def get_stats(self) -> EngineStats:
        """The stats snapshot taken after the latest step."""
        return self._stats

    def get_info(self) -> EngineInfo:
        """The wrapped engine's ``EngineInfo`` (fixed at load)."""
        return self._info

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (applied by the engine thread before its next step)."""
        self._commands.put(("reset",))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step loop; running streams end with ``EngineDeadError``."""
        self._commands.put(("stop",))
        self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    # -- engine thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        engine = self.engine
        try:
            while True:
                # Block for work when idle; otherwise drain commands without waiting.
                block = not engine.has_unfinished_requests()
                if not self._drain(block):
                    return
                if not engine.has_unfinished_requests():
                    continue
                try:
                    outputs = engine.step()
                except Exception as exc:  # fail the running requests, keep serving
                    logger.exception("engine step failed")
                    self._fail_all(exc)
                    continue
                # Stats first: a caller woken by its final output sees this step's stats.
                self._stats = engine.get_stats()
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.put(out)
        finally:
            self._stopped.set()
            dead = EngineDeadError("the engine has been shut down")
            for stream in list(self._streams.values()):
                stream.put(dead)

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; ``False`` when asked to stop."""
        while True:
            try:
                cmd = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            kind = cmd[0]
            if kind == "stop":
                return False
            if kind == "add":
                _, rid, ids, params = cmd
                try:
                    self.engine.add_request(rid, ids, params)
                except Exception as exc:  # noqa: BLE001 - the caller gets it
                    stream = self._streams.get(rid)
                    if stream is not None:
                        stream.put(exc)
            elif kind == "abort":
                self._abort(cmd[1])
            elif kind == "reset":
                self.engine.reset_prefix_cache()
            self._stats = self.engine.get_stats()

    def _abort(self, rid: str) -> None:
        final = self.engine.abort_request(rid)
        stream = self._streams.get(rid)
        if final is not None and stream is not None:
            stream.put(final)

    def _fail_all(self, exc: Exception) -> None:
        for rid in self.engine.request_ids():
            self.engine.abort_request(rid)
            stream = self._streams.get(rid)
            if stream is not None:
                stream.put(exc)
