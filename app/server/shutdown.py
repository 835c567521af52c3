"""Ending in-flight requests when ``localchat serve`` stops (Ctrl+C, SIGTERM).

``serve_cmd`` calls ``ShutdownSignal.begin`` before uvicorn's own shutdown; from then on a
stream waiting for its next output gets None from ``next_output`` (its request is aborted in
the engine by cancelling that wait) and ends with an error event (``SHUTTING_DOWN``) and
``data: [DONE]``; a request not yet answered gets a 503 with the same message, and a new one
is refused with it. So uvicorn's graceful wait finds every connection done at once instead of
cancelling the tasks after its timeout (which printed a traceback and cut the streams).
Futures, not an ``asyncio.Event``: one app may be driven by several event loops in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from localchat.app.server.errors import APIError


def stopping_line(signum: int, in_flight: int) -> str:
    """The line ``serve`` prints on stderr when signal ``signum`` stops it, with the number
    of generation requests it ends (``in_flight``): so a terminal or a service log says why
    the server went away (uvicorn itself says nothing at the default log level)."""
    name = "Ctrl+C" if signum == signal.SIGINT else signal.Signals(signum).name
    ended = "" if in_flight == 0 else \
        f"; ending {in_flight} request{'s' if in_flight != 1 else ''} in flight"
    return f"localchat: stopping ({name}){ended}"


def shutting_down_error() -> APIError:
    """The 503 a request gets when the server stops before it is answered."""
    return APIError(503, "the server is shutting down; the request was stopped (retry "
                    "against a running server)", code="server_shutting_down")


class ShutdownSignal:
    """Whether the server is stopping, and futures that complete when it begins to."""

    def __init__(self) -> None:
        self.stopping = False
        self._waiters: set[asyncio.Future[None]] = set()

    def begin(self) -> None:
        """Mark the server as stopping and wake every ``waiter``; idempotent."""
        self.stopping = True
        for fut in list(self._waiters):
            fut.get_loop().call_soon_threadsafe(_finish, fut)
        self._waiters.clear()

    def waiter(self) -> asyncio.Future[None]:
        """A future (on the running loop) done once ``begin`` has been called."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.stopping:
            fut.set_result(None)
        else:
            self._waiters.add(fut)
            fut.add_done_callback(self._waiters.discard)
        return fut

    async def race(self, awaitable: Any, *others: asyncio.Future[Any]) -> tuple[Any, Any]:
        """Await ``awaitable`` against the shutdown and ``others``: ``(done set, work)``.
        Whatever did not finish is cancelled (cancelling the work aborts an engine request);
        the work's result is ``work.result()`` when ``work`` is in the done set."""
        work = asyncio.ensure_future(awaitable)
        stop = self.waiter()
        try:
            done, _ = await asyncio.wait({work, stop, *others},
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            stop.cancel()
            for other in others:
                other.cancel()
        if work not in done:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        return done, work

    async def next_output(self, outputs: Any) -> Any:
        """``outputs``' next item, or None once the server stops (the wait is cancelled).

        Raises:
            StopAsyncIteration: ``outputs`` ended; whatever ``outputs`` raises.
        """
        if self.stopping:
            return None
        done, work = await self.race(outputs.__anext__())
        return work.result() if work in done else None


def _finish(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
