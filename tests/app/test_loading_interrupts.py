"""``interrupts.loading_interrupts``: a Ctrl+C while a model loads ends the load even when the
``KeyboardInterrupt`` its handler raised was swallowed on the way (a trial: pressed in the
first half second of ``ask``, it landed inside numpy's import, which torch runs from C code
and whose error it discards; the answer then printed with exit 0)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from localchat.app import interrupts


@pytest.fixture
def handlers():
    saved = {sig: signal.getsignal(sig) for sig in interrupts.STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _swallowing_load(sig: int) -> None:
    try:
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the handler raises here
    except KeyboardInterrupt:
        pass  # what an import run from C code does with it


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_swallowed_interrupt_still_ends_the_load(handlers, sig):
    with pytest.raises(KeyboardInterrupt):
        with interrupts.loading_interrupts():
            _swallowing_load(sig)
    assert interrupts.loading_signal() == sig
    assert signal.getsignal(sig) == signal.SIG_DFL  # a second one ends the process at once


def test_a_load_without_a_signal_restores_the_handlers(handlers):
    before = signal.getsignal(signal.SIGINT)
    with interrupts.loading_interrupts():
        pass
    assert signal.getsignal(signal.SIGINT) is before
