"""Sidebar (search, open, rename, delete, export), settings, themes and pure helpers of the TUI."""

from __future__ import annotations

import pytest

from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.status_info import StatusInfo, format_status, kv_bar
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.sidebar import ConversationItem, Sidebar
from tests.app.fake_engine import CharTokenizer, decode_ids
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine


def chat(app) -> ChatScreen:
    assert isinstance(app.screen, ChatScreen)
    return app.screen


def seed(store, title: str, turns: list[tuple[str, str]]) -> str:
    conv = store.create_conversation("smollm2-135m", None, {}, title=title)
    for user, reply in turns:
        store.add_message(conv.id, "user", user)
        store.add_message(conv.id, "assistant", reply)
    return conv.id


def sidebar_ids(app) -> list[str]:
    return [i.conversation_id for i in chat(app).query(ConversationItem)]


async def test_search_and_reopen_restores_and_continues(make_app):
    engine = GatedEngine([["sure"]], gated=False)
    app = make_app(engine)
    dragons = seed(app.store, "Dragons", [("tell me about dragons", "they fly")])
    seed(app.store, "Cooking", [("how to boil an egg", "ten minutes")])
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: chat(app).query_one(Sidebar).open)
        await pilot.press(*"dragon")  # porter stemming finds "dragons"
        await wait_for(pilot, lambda: sidebar_ids(app) == [dragons], what="the search hit")
        await pilot.press("enter")  # from the search box to the list
        await pilot.press("enter")  # open the hit
        await wait_for(pilot, lambda: chat(app).current.id == dragons)
        views = chat(app).query_one(ChatLog).views()
        assert [(v.role, v.text) for v in views] == [("user", "tell me about dragons"),
                                                     ("assistant", "they fly")]
        chat(app).query_one("#prompt").focus()
        await pilot.press(*"more", "enter")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4)
        assert decode_ids(engine.calls[0]["ids"]) == (
            "user:tell me about dragons|assistant:they fly|user:more|assistant:")
        assert [m.content for m in app.store.get_conversation(dragons).messages][-1] == "sure"


async def test_rename_delete_export(make_app, tmp_path):
    app = make_app(GatedEngine(gated=False))
    a = seed(app.store, "First", [("q1", "a1")])
    b = seed(app.store, "Second", [("q2", "a2")])
    async with app.run_test(size=(100, 30)) as pilot:
        await chat(app).open_conversation(a)
        await pilot.press("f2")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        await pilot.press(*["ctrl+a", "ctrl+k"])  # clear the input (readline keys)
        app.screen.query_one("Input").value = "Renamed"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert app.store.get_conversation(a).title == "Renamed"
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        target = tmp_path / "out.md"
        app.screen.query_one("Input").value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: target.exists())
        assert target.read_text(encoding="utf-8") == app.store.export_markdown(a)
        await pilot.press("f8")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: chat(app).current.id is None, what="the delete")
        assert [c.id for c in app.store.list_conversations()] == [b]


async def test_a_title_with_markup_characters_is_asked_about_and_deleted(make_app):
    """A conversation titled "[/] what does this regex mean?" (a closing markup tag): the
    delete dialog shows the title as written instead of crashing on it as markup."""
    app = make_app(GatedEngine(gated=False))
    title = "[/] what does [b]this[/b] regex mean?"
    a = seed(app.store, title, [("q1", "a1")])
    async with app.run_test(size=(100, 30)) as pilot:
        await chat(app).open_conversation(a)
        await pilot.press("f8")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        shown = str(app.screen.query_one(".title").render())
        assert title in shown
        await pilot.press("y")
        await wait_for(pilot, lambda: chat(app).current.id is None, what="the delete")
        assert app.store.list_conversations() == []


async def test_export_asks_before_replacing_an_existing_file(make_app, tmp_path):
    """Ctrl+T onto an existing file replaced it without a word (new-user trial): now a
    confirmation; "n" keeps the file as it was, "y" replaces it with the export."""
    app = make_app(GatedEngine(gated=False))
    a = seed(app.store, "First", [("q1", "a1")])
    target = tmp_path / "notes.md"
    target.write_text("IMPORTANT USER NOTES\n", encoding="utf-8")
    async with app.run_test(size=(100, 30)) as pilot:
        await chat(app).open_conversation(a)
        for answer in ("n", "y"):
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
            app.screen.query_one("Input").value = str(target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: "exists" in str(
                app.screen.query_one("Label").render()), what="the confirmation")
            await pilot.press(answer)
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            if answer == "n":
                assert target.read_text(encoding="utf-8") == "IMPORTANT USER NOTES\n"
        await wait_for(pilot, lambda: target.read_text(encoding="utf-8")
                       == app.store.export_markdown(a), what="the export")
        # a folder is refused with a notice, not offered for replacing
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        app.screen.query_one("Input").value = str(tmp_path)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(pilot, lambda: any("is a folder" in str(n.message)
                                          for n in app._notifications), what="the notice")


async def test_settings_apply_to_the_next_turn(make_app):
    engine = GatedEngine([["r"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        app.screen.query_one("#system_prompt").text = "Be brief."
        app.screen.query_one("#s-temperature").value = "0"
        app.screen.query_one("#s-max_tokens").value = "7"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat(app).query_one("#prompt").focus()
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        call = engine.calls[0]
        assert decode_ids(call["ids"]) == "system:Be brief.|user:hi|assistant:"
        assert call["sampling"].temperature == 0 and call["sampling"].max_tokens == 7
        conv = app.store.get_conversation(chat(app).current.id)
        assert conv.system_prompt == "Be brief." and conv.sampling["max_tokens"] == 7


async def test_settings_reject_bad_values(make_app):
    app = make_app(GatedEngine(gated=False))
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        app.screen.query_one("#s-top_p").value = "7"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app._notifications)
        assert not isinstance(app.screen, ChatScreen)  # still open
        assert any("top_p" in n.message for n in app._notifications)


async def test_theme_flag_palette_switch_and_config(make_app, isolated_home):
    from localchat.app.settings import load_settings

    app = make_app(GatedEngine(), theme="high-contrast", remember_theme=True)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.theme == "localchat-high-contrast"
        before = chat(app).styles.background
        await pilot.press("ctrl+p")
        await pilot.press(*"theme")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press(*"localchat-light")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.theme == "localchat-light", what="the switch")
        await wait_for(pilot, lambda: chat(app).styles.background != before)
        assert chat(app).styles.background.brightness > 0.9  # the light theme's background
        await wait_for(pilot, lambda: load_settings().theme == "localchat-light",
                       what="the config file")
    # The next start uses the remembered theme.
    again = make_app(GatedEngine(), settings=load_settings())
    assert again.theme == "localchat-light"


def test_unknown_theme_falls_back_with_a_warning(make_app):
    app = make_app(GatedEngine(), theme="nope")
    assert app.theme == "localchat-dark" and "unknown theme 'nope'" in app._theme_warning


def test_status_line_fits_width_and_drops_parts():
    info = StatusInfo(state="ready", model="smollm2-135m", weight_format="fp32", device="cpu",
                      ttft=0.123, decode_tokens_per_s=15.25, cached_tokens=96,
                      prompt_tokens=120, spec_acceptance=None, kv_usage=0.5,
                      context_used=130, max_model_len=2048)
    wide = format_status(info, 200).plain
    assert wide == ("smollm2-135m fp32 │ cpu │ TTFT 0.12s │ 15.2 tok/s │ cached 96/120 │ "
                    "spec - │ KV ███░░░ 50% │ ctx 130/2048")
    previous = wide
    for width in (100, 90, 80, 70, 60, 50, 40, 30, 20):
        line = format_status(info, width).plain
        assert len(line) <= width and len(line) <= len(previous)
        previous = line
    # Labels go before parts: the speculative field is still there at 98 columns.
    assert "│ s - │" in format_status(info, 98).plain
    assert "96/120" in format_status(info, 30).plain


@pytest.mark.parametrize(("usage", "bar"), [(None, "-"), (0.0, "░░░░░░"), (1.0, "██████"),
                                            (0.34, "██░░░░")])
def test_kv_bar(usage, bar):
    assert kv_bar(usage) == bar


def test_fit_prompt_drops_old_turns_and_says_so():
    from localchat.app.session import fit_prompt
    from localchat.app.tui.state import ChatMessage, ConversationState

    state = ConversationState(messages=[ChatMessage("user", "a" * 40),
                                        ChatMessage("assistant", "b" * 40),
                                        ChatMessage("user", "c")])
    session = state.session()
    ids, notes = fit_prompt(session, CharTokenizer(), max_model_len=64, max_tokens=16)
    assert decode_ids(ids) == "user:c|assistant:" and session.last_dropped_turns == 1
    assert notes == ["dropped 1 earlier turn to fit the context (64 tokens)"]
    full, _ = fit_prompt(state.session(), CharTokenizer(), max_model_len=4096, max_tokens=16)
    assert decode_ids(full).startswith("user:" + "a" * 40)


def test_status_from_outputs_and_stats():
    from localchat.app.tui.status_info import with_output, with_stats
    from localchat.engine.outputs import EngineStats, RequestMetrics, RequestOutput

    metrics = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.1, first_token_time=1.5,
                             last_token_time=2.5, num_prompt_tokens=40, num_cached_tokens=32,
                             num_output_tokens=11, num_draft_tokens=8, num_accepted_tokens=6)
    out = RequestOutput("r", [5], "x", "x" * 11, 40, 11, metrics=metrics, num_cached_tokens=32)
    stats = EngineStats(num_running=1, num_waiting=0, num_blocks=10, block_size=16,
                        kv_cache_usage=0.3, prefix_cache_queries=0, prefix_cache_hits=0,
                        num_preemptions=0, max_model_len=2048)
    info = with_stats(with_output(StatusInfo(model="m"), out), stats)
    assert (info.ttft, info.decode_tokens_per_s) == (0.5, 10.0)  # 10 tokens after the first / 1 s
    assert (info.cached_tokens, info.prompt_tokens, info.context_used) == (32, 40, 51)
    assert info.spec_acceptance == 0.75 and info.kv_usage == 0.3 and info.max_model_len == 2048
    line = format_status(info, 200).plain
    assert "spec 75%" in line and "cached 32/40" in line and "ctx 51/2048" in line


async def test_delete_a_conversation_while_it_streams(make_app):
    engine = GatedEngine([["x", "y", "z"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat(app).query_one("#prompt").focus()
        await pilot.press("h", "i", "enter")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 1)
        await pilot.press("f8")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: chat(app).current.id is None and not chat(app).states)
        assert app.store.list_conversations() == []
        assert engine.aborted == [engine.calls[0]["request_id"]]


async def test_unknown_key_binding_name_is_a_warning(make_app):
    from localchat.app.settings import Settings

    app = make_app(GatedEngine(), settings=Settings(keys={"frobnicate": "ctrl+g"}))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app._notifications)
        assert any("unknown key binding 'frobnicate'" in n.message for n in app._notifications)
        assert isinstance(app.screen, ChatScreen)
