"""A model or draft the load would refuse is refused before the running engine is given up,
and a switch whose load fails anyway loads the previous model again (a new-user trial: one
typo in Ctrl+S unloaded SmolLM2, and nothing brought it back)."""

from __future__ import annotations

import asyncio

from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.screens.settings_screen import SettingsScreen
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine
from tests.app.tui.test_tui_history import chat, seed


def recording_loader(fail: tuple[str, ...] = ()):
    """``(loader, loads)``: a fake loader answering with a new ``GatedEngine``, raising
    ``ModelNotFoundError`` for the specs in ``fail``; ``loads`` lists ``(spec, draft)``."""
    from localchat.engine.errors import ModelDownloadError

    loads: list[tuple[str, str | None]] = []

    def loader(spec, *, draft=None, **kwargs):
        loads.append((spec, draft))
        if spec in fail:
            raise ModelDownloadError(f"cannot download {spec}: network unreachable")
        return GatedEngine(gated=False)

    return loader, loads


async def save_settings(pilot, app, **fields: str) -> None:
    """Open Ctrl+S, set the ``Input`` fields by id, press Ctrl+S."""
    await pilot.press("ctrl+s")
    await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
    for name, value in fields.items():
        app.screen.query_one(f"#{name}").value = value
    await pilot.press("ctrl+s")
    await pilot.pause()


async def test_a_model_that_names_nothing_keeps_the_engine_and_the_settings(make_app):
    loader, loads = recording_loader()
    app = make_app(None, engine_loader=loader, model="smollm2-135m")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None)
        engine = app.engine
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#system_prompt").text = "Be brief."
        app.screen.query_one("#model").value = "nonexistent-model"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: any("nonexistent-model" in str(n.message)
                                          for n in app._notifications), what="the refusal")
        assert isinstance(app.screen, SettingsScreen)  # still open: the typo can be fixed
        assert "is not a model alias" in str(list(app._notifications)[-1].message)
        assert app.engine is engine and not engine.shut_down
        assert app.model_name == "smollm2-135m" and loads == [("smollm2-135m", None)]
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert chat(app).current.system_prompt is None  # the old settings stay
        chat(app).query_one("#prompt").focus()
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2, what="the reply")


async def test_a_draft_that_is_the_model_itself_is_refused_before_unloading(make_app,
                                                                          smollm2_gguf):
    """As ``localchat ask --draft`` refuses it (exit 2), before anything loads."""
    loader, loads = recording_loader()
    model = str(smollm2_gguf)
    app = make_app(None, engine_loader=loader, model=model)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None)
        engine = app.engine
        await save_settings(pilot, app, draft=model)
        await wait_for(pilot, lambda: any("the draft is the model itself" in str(n.message)
                                          for n in app._notifications), what="the refusal")
        assert isinstance(app.screen, SettingsScreen)
        assert app.engine is engine and not engine.shut_down
        assert app.draft is None and loads == [(model, None)]


async def test_a_failed_switch_loads_the_previous_model_again(make_app):
    """A model that looks right (a catalog alias) but fails to load: the one that answered
    before is loaded again, so the chat goes on; the conversation keeps its model."""
    loader, loads = recording_loader(fail=("qwen2.5-3b",))
    app = make_app(None, engine_loader=loader, model="smollm2-135m")
    conv_id = seed(app.store, "First", [("q1", "a1")])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None)
        await chat(app).open_conversation(conv_id)
        await save_settings(pilot, app, model="qwen2.5-3b")
        await wait_for(pilot, lambda: len(loads) == 3 and app.engine is not None,
                       what="the previous model back")
        assert loads == [("smollm2-135m", None), ("qwen2.5-3b", None), ("smollm2-135m", None)]
        assert app.model_name == "smollm2-135m" and app.engine_error is None
        assert any("cannot download qwen2.5-3b" in str(n.message) for n in app._notifications)
        assert app.store.get_conversation(conv_id).model == "smollm2-135m"
        chat(app).query_one("#prompt").focus()
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4, what="the reply")


async def test_quitting_while_a_load_runs_is_known_to_run_tui(make_app):
    """A load cannot be interrupted (a repack in progress): the app counts the loads running
    on their threads, so that ``run_tui`` says why the process waits after the screen is
    gone, rather than leaving a blank terminal; the count is 0 once the load ends."""
    import threading

    release = threading.Event()

    def slow_loader(model, **kwargs):
        release.wait(30)
        return GatedEngine(gated=False)

    app = make_app(None, engine_loader=slow_loader, model="smollm2-135m")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loads_running == 1, what="the load")
        await pilot.press("ctrl+q")
    assert app.loads_running == 1  # quit while loading: run_tui's note is due
    release.set()
    for _ in range(100):
        if app.loads_running == 0:
            break
        await asyncio.sleep(0.05)
    assert app.loads_running == 0
