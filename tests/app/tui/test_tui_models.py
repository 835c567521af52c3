"""The model picker (catalog + cache state, memory plan, pull) and switching models."""

from __future__ import annotations

from localchat.app.settings import cache_dir as settings_cache_dir
from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.screens.model_picker import ModelPickerScreen
from localchat.engine.hub.resolve import list_models
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine


async def test_picker_lists_catalog_pulls_and_switches(make_app, monkeypatch):
    from localchat.engine.hub import resolve as hub

    pulled = []

    def fake_resolve(spec, *, cache_dir, download=True, progress=None, **kw):
        if not download:  # the check before the switch: not on disk
            return
        progress(f"downloading {spec}: 50%")
        progress(f"downloading {spec}: 100%")
        pulled.append(spec)

    monkeypatch.setattr(hub, "resolve_model", fake_resolve)
    loads = []

    def loader(spec, **kwargs):
        loads.append(spec)
        return GatedEngine(gated=False)

    app = make_app(None, engine_loader=loader, model="smollm2-135m")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPickerScreen))
        picker = app.screen
        table = picker.query_one("DataTable")
        expected = list_models(settings_cache_dir())  # nothing is cached under this LOCALCHAT_HOME
        await wait_for(pilot, lambda: table.row_count == len(expected))
        aliases = [str(table.get_row_at(i)[0]).split(" ")[0] for i in range(table.row_count)]
        assert aliases == [m.alias for m in expected]
        assert not any(m.cached for m in expected)
        target = expected[1].alias
        table.move_cursor(row=1)
        await wait_for(pilot, lambda: "not cached" in str(picker.query_one("#plan").render()))
        await pilot.press("enter")  # not cached: pulls first
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen), what="the pull")
        assert pulled == [target]
        await wait_for(pilot, lambda: loads == ["smollm2-135m", target] and app.engine,
                       what="the switch")
        assert app.model_name == target
        screen = app.screen
        await wait_for(pilot, lambda: screen.info.model == target)


def test_plan_for_a_cached_model(smollm2_gguf, cache_dir):
    """The picker's plan is ``localchat plan``'s: the format the engine loads (the GGUF's own,
    ``native``, where auto picks it: the picker said bf16 while native loaded, a new-user
    trial), the native row and every planner row, against the planner called directly."""
    from localchat.app.tui.engine_host import plan_for
    from localchat.engine.loader import load_model_config
    from localchat.engine.memory.budget import DeviceSpec, default_budget_bytes
    from localchat.engine.memory.planner import plan_memory

    text = plan_for(smollm2_gguf, context_len=2048)
    plan = plan_memory(load_model_config(smollm2_gguf, cache_dir=cache_dir),
                       default_budget_bytes("cpu"), 2048, device=DeviceSpec.detect("cpu"),
                       int4_group_size=32)  # a GGUF's blocks
    assert text.splitlines()[0].startswith(f"format native at {plan.context_len} tokens")
    assert "native weights" in text.splitlines()[1]
    for row in plan.rows:
        assert f"weights {row.weight_bytes / 2**20:,.0f} MiB" in text

async def test_a_failed_switch_is_not_written_into_the_conversation(make_app):
    """Switching to a model that fails to load wrote its name into the open conversation, so
    ``history`` named it for turns another model wrote (a second trial). The stored model
    changes only once the new model has loaded; a name that names no model is refused before
    anything unloads."""
    from localchat.engine.errors import ModelDownloadError
    from tests.app.tui.test_tui_history import chat, seed

    loads = []

    def loader(spec, **kwargs):
        loads.append(spec)
        if spec == "qwen2.5-3b":
            raise ModelDownloadError("cannot download qwen2.5-3b")
        return GatedEngine(gated=False)

    app = make_app(None, engine_loader=loader, model="smollm2-135m")
    conv_id = seed(app.store, "First", [("q1", "a1")])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None)
        await chat(app).open_conversation(conv_id)
        assert chat(app).switch_model("nosuch", None) is False
        assert loads == ["smollm2-135m"] and app.engine is not None
        assert chat(app).switch_model("qwen2.5-3b", None) is True
        await wait_for(pilot, lambda: len(loads) == 3 and app.engine is not None,
                       what="the failed load, then the previous model again")
        assert app.store.get_conversation(conv_id).model == "smollm2-135m"
        chat(app).switch_model("qwen2.5-coder-0.5b", None)
        await wait_for(pilot, lambda: app.engine is not None and app.engine_error is None,
                       what="the second load")
        await wait_for(pilot, lambda: app.store.get_conversation(conv_id).model
                       == "qwen2.5-coder-0.5b", what="the stored model")
