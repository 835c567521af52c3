"""``ask``'s model load runs without automatic garbage collection and freezes what it built
(``app/startup_gc.py``); the collector's state comes back afterwards, after an error too."""

from __future__ import annotations

import gc

import pytest

from localchat.app import ask_cmd
from localchat.app.startup_gc import collected_after_load


@pytest.fixture(autouse=True)
def _unfreeze():
    yield
    gc.unfreeze()  # give the test process's objects back to the collector
    gc.enable()


def test_no_collection_inside_then_frozen():
    gc.unfreeze()
    gc.enable()
    seen = []
    with collected_after_load():
        seen.append(gc.isenabled())
        built = [object() for _ in range(10)]  # long-lived objects a load creates
        assert gc.collect() >= 0  # an explicit pass still runs (only automatic ones stop)
    assert seen == [False]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)
    del built


def test_state_comes_back_after_an_error_and_when_it_was_off():
    gc.unfreeze()
    gc.disable()
    with pytest.raises(RuntimeError), collected_after_load():
        raise RuntimeError("load failed")
    assert not gc.isenabled()  # it was off before: it stays off
    assert gc.get_freeze_count() > 0


def test_ask_load_engine_loads_with_collection_off(monkeypatch):
    from localchat.app import engine_loader

    gc.unfreeze()
    gc.enable()
    states = []

    def fake_load(options):
        states.append(gc.isenabled())
        return "engine"

    monkeypatch.setattr(engine_loader, "load", fake_load)
    assert ask_cmd.load_engine(object()) == "engine"
    assert states == [False] and gc.isenabled() and gc.get_freeze_count() > 0
