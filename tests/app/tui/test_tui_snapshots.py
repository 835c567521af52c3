"""Snapshot tests (pytest-textual-snapshot): the reference SVGs live in
tests/app/tui/__snapshots__; regenerate them after an intended change with
``python -m pytest tests/app/tui/test_tui_snapshots.py --snapshot-update`` and review the diff.

The fake engine's clock is deterministic (``StepClock``), so TTFT and tokens/s are fixed;
message times and sidebar dates are pinned (``fixed_times``).
"""

from __future__ import annotations

import pytest

from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.sidebar import ConversationItem, Sidebar
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine, StepClock

SIZE = (100, 30)


@pytest.fixture(autouse=True)
def fixed_times(monkeypatch):
    """Message times and sidebar dates read the wall clock: show fixed ones."""
    monkeypatch.setattr("localchat.app.tui.widgets.message_view.when", lambda ts: "10:21")
    monkeypatch.setattr("localchat.app.tui.widgets.sidebar.day", lambda ts: "Dec 01")


async def settle(pilot) -> None:
    """Let layout settle: the footer recomposes when bindings change (a reply starts), which
    can take more than one refresh on a loaded machine."""
    pilot.app.screen.query_one(PromptInput).cursor_blink = False
    for _ in range(3):
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()


def test_empty_chat(snap_compare, make_app):
    app = make_app(GatedEngine(clock=StepClock()))
    assert snap_compare(app, terminal_size=SIZE, run_before=settle)


def test_mid_stream_reply_with_code_block(snap_compare, make_app):
    deltas = ["Here is a loop:\n\n", "```python\nfor i in range(3):\n", "    print(i)\n",
              "```\n\nIt prints 0, 1", " and 2."]
    engine = GatedEngine([deltas], clock=StepClock())
    app = make_app(engine)
    shown = "".join(deltas[:3])

    async def run_before(pilot) -> None:
        pilot.app.screen.query_one(PromptInput).focus()
        await pilot.press(*"loop", "enter")
        engine.release(3)
        log = pilot.app.screen.query_one(ChatLog)
        await wait_for(pilot, lambda: log.views() and log.views()[-1].markdown.source == shown,
                       what="three deltas rendered")
        # The status bar polls the engine's stats on a timer: wait until it has seen the
        # running request (the fake reports 1 running = 25% KV), whenever the timer fires.
        await wait_for(pilot, lambda: pilot.app.screen.info.kv_usage == 0.25,
                       what="KV usage polled")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_sidebar_open(snap_compare, make_app):
    app = make_app(GatedEngine(clock=StepClock()))
    for title in ("Paged attention notes", "Rust lifetimes", "Dinner ideas"):
        conv = app.store.create_conversation("smollm2-135m", None, {}, title=title)
        app.store.add_message(conv.id, "user", f"About {title.lower()}")

    async def run_before(pilot) -> None:
        await pilot.press("ctrl+b")
        screen = pilot.app.screen
        await wait_for(pilot, lambda: len(screen.query(ConversationItem)) == 3)
        assert screen.query_one(Sidebar).open
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_error_notification(snap_compare, make_app):
    from localchat.engine.errors import ModelNotFoundError

    def loader(spec, **kwargs):
        raise ModelNotFoundError(f"unknown model '{spec}'; see 'localchat models'")

    app = make_app(None, engine_loader=loader, model="no-such-model")

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: pilot.app.engine_error is not None)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
