"""Ctrl+C while ``ask`` loads a model and while it streams a reply.

``loading_interrupts``: the first Ctrl+C (SIGTERM, SIGHUP) cancels the load, a second one
ends the process at once. ``InterruptGuard``: Ctrl+C (and SIGTERM, SIGHUP) stops generation at once, except while a delta is being
printed and recorded, so the saved partial reply is exactly what was printed. Both only act in
the main thread (Python delivers signals there).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def loading_interrupts() -> Iterator[None]:
    """While loading a model: the first Ctrl+C (or SIGTERM, SIGHUP: ``STOP_SIGNALS``) raises
    ``KeyboardInterrupt`` (exit 128 + the signal once the current call returns;
    :func:`loading_signal` says which), and from then on those signals have their default
    action, so a second one ends the process at once, even inside a long C call (torch, file
    reads). The previous handlers come back when the block ends without an interrupt. A
    signal whose ``KeyboardInterrupt`` the block swallowed (it can land inside an import that
    C code runs and discards the error of: torch importing numpy) still ends it, at its end.
    Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: Any) -> None:
        global _loading_signal
        _loading_signal = signum
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        raise KeyboardInterrupt

    global _loading_signal
    _loading_signal = None
    previous = {sig: signal.signal(sig, first) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is first:
                signal.signal(sig, handler)
    if _loading_signal is not None:  # the block ran on past the handler's KeyboardInterrupt
        raise KeyboardInterrupt


_loading_signal: int | None = None


def loading_signal() -> int:
    """The signal that interrupted the last load (``loading_interrupts``); SIGINT when none
    did (a ``KeyboardInterrupt`` from elsewhere)."""
    return _loading_signal if _loading_signal is not None else signal.SIGINT


# Signals that end a reply the way Ctrl+C does: the terminal closing (SIGHUP) and a polite
# kill (SIGTERM, also what service managers and `timeout` send). The process then exits with
# 128 + the signal's number, as a shell reports it.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
STOP_EXIT_CODES = frozenset(128 + sig for sig in STOP_SIGNALS)  # 130, 143, 129


class InterruptGuard:
    """A handler for SIGINT, SIGTERM and SIGHUP (``STOP_SIGNALS``) that raises
    ``KeyboardInterrupt`` at once, except inside ``critical()`` sections, where it is held
    until the section ends. ``ask`` prints and records each text delta in one section, so the
    saved partial reply is exactly what was printed. ``signum`` is the signal that arrived
    first (None until one does).

    Use ``with guard.installed(): ... with guard.critical(): ...`` in the main thread.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self.signum: int | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self._depth:
            self._pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handler for the block (a no-op outside the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Hold Ctrl+C until the block ends, then raise it."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt


def with_stop_lines(run: Callable[[], int]) -> int:
    """``run()`` (the CLI) and the process's exit after it, in ``localchat``'s own entry point
    only (never in a host process, whose handlers these replace for good): where SIGTERM or
    SIGHUP (or, once ``run`` has returned, Ctrl+C) would end the process without a word, they
    print one line, ``localchat: stopped by SIGTERM``, and end it at once with 128 + the
    signal. ``ask``'s guards replace these handlers while they run and put them back after,
    so a SIGTERM that arrives after a reply was saved, while the process exits (the weight
    cache's background write, interpreter teardown), is said too. Returns ``run()``'s code."""
    if threading.current_thread() is not threading.main_thread():
        return run()
    _say_and_exit_on(tuple(sig for sig in STOP_SIGNALS if sig != signal.SIGINT), "")
    code = run()
    _say_and_exit_on(STOP_SIGNALS, "; the command had finished, and the process was exiting")
    return code


def _say_and_exit_on(signals: tuple[int, ...], detail: str) -> None:
    import os
    import sys

    def stop(signum: int, frame: Any) -> None:
        try:
            sys.stderr.write(f"localchat: stopped by {signal.Signals(signum).name}{detail}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os._exit(128 + signum)

    for sig in signals:
        signal.signal(sig, stop)
