"""Issue 18's TUI items, each reproduced with Pilot: hard line breaks, the settings dialog at
120x40, the help table, toasts, search keys and snippets, the status bar after Ctrl+N, each
message's time and model, the sidebar's date and model, and the sampling values shown.

References are independent of the widgets under test: ``SamplingParams``' own defaults, the
store's rows (times, models), the screen's geometry (regions) and the text the user typed.
"""

from __future__ import annotations

from dataclasses import fields

from textual.widgets import Button, DataTable, ListView
from textual.widgets._markdown import MarkdownParagraph
from textual.widgets._toast import Toast

from localchat.app.settings import Settings
from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.screens.help_screen import HelpScreen
from localchat.app.tui.screens.settings_screen import SettingsScreen
from localchat.app.tui.timefmt import day, when
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.sidebar import ConversationItem, Sidebar
from localchat.app.tui.widgets.status_bar import StatusBar
from localchat.engine.sampling_params import SamplingParams
from tests.app.fake_engine import decode_ids
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine
from tests.app.tui.test_tui_chat import type_and_send


def chat(app) -> ChatScreen:
    assert isinstance(app.screen, ChatScreen)
    return app.screen


async def type_text(pilot, text: str) -> None:
    keys = {" ": "space", "\n": "ctrl+j"}
    await pilot.press(*[keys.get(c, c) for c in text])


async def send(pilot, text: str) -> None:
    chat(pilot.app).query_one(PromptInput).focus()
    await type_text(pilot, text)
    await pilot.press("enter")


async def test_single_newlines_are_hard_line_breaks(make_app):
    engine = GatedEngine([["Alpha\nBeta\nGamma"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "Line one\nLine two")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2, what="the reply")
        await pilot.pause()
        user, reply = chat(app).query_one(ChatLog).views()
        assert user.text == "Line one\nLine two"  # the reference: what was typed
        # Short lines in a 100-column terminal: one rendered row per source line; collapsed
        # soft breaks would give a single row each.
        (p_user,) = user.query(MarkdownParagraph)
        (p_reply,) = reply.query(MarkdownParagraph)
        assert p_user.size.height == 2
        assert p_reply.size.height == 3


async def test_settings_at_120x40_buttons_focus_and_current_values(make_app):
    engine = GatedEngine([["r"]], gated=False)
    app = make_app(engine, settings=Settings(sampling={"temperature": 0.3}))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.pause()
        screen = app.screen
        for button in screen.query(Button):
            assert button.region.height > 0 and screen.region.contains_region(button.region), \
                button.id
        assert app.focused is screen.query_one("#system_prompt")
        await type_text(pilot, "Be brief")  # the first keys typed land in the first field
        assert screen.query_one("#system_prompt").text == "Be brief"
        defaults = {f.name: f.default for f in fields(SamplingParams)}
        assert screen.query_one("#s-temperature").value == "0.3"  # the user's setting
        for name in ("top_p", "top_k", "min_p", "repetition_penalty", "max_tokens"):
            assert screen.query_one(f"#s-{name}").value == str(defaults[name]), name
        assert screen.query_one("#s-seed").value == ""  # None: random
        await pilot.click("#save")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        # Values left as shown are not pinned on the conversation.
        assert chat(app).current.sampling == {}
        assert chat(app).current.system_prompt == "Be brief"
        await send(pilot, "hi")
        await wait_for(pilot, lambda: engine.calls, what="the request")
        assert engine.calls[0]["sampling"].temperature == 0.3


async def test_help_table_shows_config_names_uncut(make_app):
    app = make_app(GatedEngine())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert str(table.columns[next(iter(table.columns))].label) == "config name"
        assert table.max_scroll_x == 0  # every column fits: nothing is cut off
        assert table.virtual_size.width <= table.scrollable_content_region.width


async def test_toasts_do_not_cover_prompt_or_status_bar(make_app):
    app = make_app(GatedEngine())
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        for i in range(3):
            app.notify(f"notice {i}: " + "a long message " * 8, timeout=30)
        await wait_for(pilot, lambda: len(app.screen.query(Toast)) == 3, what="the toasts")
        await pilot.pause()
        prompt = chat(app).query_one(PromptInput).region
        status = chat(app).query_one(StatusBar).region
        for toast in app.screen.query(Toast):
            assert toast.region.height > 0
            assert not toast.region.overlaps(prompt)
            assert not toast.region.overlaps(status)


def _seed(store, title: str, text: str) -> str:
    conv = store.create_conversation("smollm2-135m", None, {}, title=title)
    store.add_message(conv.id, "user", text)
    return conv.id


async def test_search_enter_opens_and_down_moves(make_app):
    app = make_app(GatedEngine())
    older = _seed(app.store, "Older", "a dragon in the hills")
    newer = _seed(app.store, "Newer", "the dragon returns")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+f")
        await type_text(pilot, "dragon")
        sidebar = chat(app).query_one(Sidebar)
        await wait_for(pilot, lambda: len(sidebar.query(ConversationItem)) == 2)
        hits = [h.conversation_id for h in app.store.search("dragon")]
        assert hits == [newer, older]
        await pilot.press("enter")  # opens the highlighted (first) hit
        await wait_for(pilot, lambda: chat(app).current.id == newer, what="the first hit")
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: app.focused is sidebar.query_one("#search"))
        await pilot.press("down")  # from the search box into the list, one entry down
        view = sidebar.query_one(ListView)
        assert app.focused is view and view.index == 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: chat(app).current.id == older, what="the second hit")


async def test_search_snippet_shows_the_matched_word(make_app):
    app = make_app(GatedEngine())
    filler = " ".join(f"word{i}" for i in range(14))
    _seed(app.store, "Long", f"{filler} then a wyvern appears {filler}")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+f")
        await type_text(pilot, "wyvern")
        sidebar = chat(app).query_one(Sidebar)
        await wait_for(pilot, lambda: len(sidebar.query(ConversationItem)) == 1)
        await pilot.pause()
        (item,) = sidebar.query(ConversationItem)
        label = item.query_one("Label")
        # What the narrow sidebar actually shows of the snippet line: the label's text cut to
        # the list item's width.
        shown = [line[:item.content_region.width]
                 for line in str(label.render()).splitlines()]
        assert item.content_region.width < 40
        assert "wyvern" in shown[1], shown


async def test_new_chat_drops_the_old_context_figure(make_app):
    engine = GatedEngine([["four"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await send(pilot, "hello")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        cid = chat(app).current.id
        usage = app.store.get_conversation(cid).messages[-1].stats["usage"]
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        bar = chat(app).query_one(StatusBar)
        await wait_for(pilot, lambda: f"ctx {used}/" in bar.plain, what="the context figure")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: chat(app).current.id is None)
        await pilot.pause()
        assert chat(app).info.context_used is None
        assert f"{used}/" not in bar.plain and "ctx -" in bar.plain
        await chat(app).open_conversation(cid)  # reopening shows that conversation's figure
        await pilot.pause()
        assert f"ctx {used}/" in bar.plain


async def test_messages_show_time_and_model_sidebar_date_and_model(make_app):
    engine = GatedEngine([["first"], ["second"]], gated=False)
    app = make_app(engine, model="model-a")
    async with app.run_test(size=(120, 30)) as pilot:
        await send(pilot, "one")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        app.model_name = "model-b"  # as after a switch (Ctrl+O), without reloading
        await send(pilot, "two")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4)
        cid = chat(app).current.id
        rows = app.store.get_conversation(cid).messages
        assert [(m.stats or {}).get("model") for m in rows] == [None, "model-a", None,
                                                                "model-b"]
        for reopen in (False, True):
            if reopen:
                await pilot.press("ctrl+n")
                await chat(app).open_conversation(cid)
                await pilot.pause()
            views = chat(app).query_one(ChatLog).views()
            roles = [str(v.query_one(".role").render()) for v in views]
            assert roles == [f"You · {when(rows[0].created)}",
                             f"Assistant · model-a · {when(rows[1].created)}",
                             f"You · {when(rows[2].created)}",
                             f"Assistant · model-b · {when(rows[3].created)}"]
        await pilot.press("ctrl+b")
        sidebar = chat(app).query_one(Sidebar)
        await wait_for(pilot, lambda: len(sidebar.query(ConversationItem)) == 1)
        conv = app.store.get_conversation(cid, with_messages=False)
        (item,) = sidebar.query(ConversationItem)
        label = str(item.query_one("Label").render())
        assert label.splitlines()[1].strip() == f"{day(conv.updated)} · {conv.model}"


async def test_current_sampling_values_are_visible(make_app):
    app = make_app(GatedEngine(), settings=Settings(sampling={"temperature": 0.2,
                                                              "top_p": 0.9}))
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = chat(app).query_one(PromptInput)
        await wait_for(pilot, lambda: bool(prompt.border_subtitle))
        default_max = SamplingParams().max_tokens
        assert prompt.border_subtitle == f"temp 0.2 · top-p 0.9 · max {default_max}"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#s-temperature").value = "0.5"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert chat(app).current.sampling == {"temperature": 0.5}
        assert prompt.border_subtitle == f"temp 0.5 · top-p 0.9 · max {default_max}"


async def test_context_reaches_the_loader_and_the_status_bar(make_app, monkeypatch):
    seen = []

    def loader(spec, **kwargs):
        seen.append(kwargs)
        return GatedEngine(max_model_len=kwargs.get("context") or 4096)

    monkeypatch.setenv("LOCALCHAT_CONTEXT", "3000")
    from localchat.app.settings import load_settings

    app = make_app(None, engine_loader=loader, settings=load_settings(), context=1234)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None, what="the load")
        assert seen[0]["context"] == 1234 and seen[0]["context_origin"] == "--context"
        bar = chat(app).query_one(StatusBar)
        await wait_for(pilot, lambda: "ctx -/1234" in bar.plain, what="the context in use")
    again = make_app(None, engine_loader=loader, settings=load_settings())
    async with again.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: again.engine is not None, what="the load")
        assert seen[1]["context"] == 3000 and seen[1]["context_origin"] == "LOCALCHAT_CONTEXT"


async def test_a_message_longer_than_the_context_is_refused_before_it_is_saved(make_app):
    """A message the context cannot hold with any reply (a pasted file): refused in the
    prompt, as a send during a reply is; it is not saved, so the next, shorter message still
    gets the earlier turn in its prompt rather than losing it to the refused one."""
    engine = GatedEngine([["r1"], ["r2"]], gated=False, max_model_len=96)
    app = make_app(engine, settings=Settings(sampling={"max_tokens": 16}))
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "a" * 10)
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        prompt = chat(app).query_one(PromptInput)
        prompt.text = "z" * 200  # (pasted)
        await pilot.press("end", "enter")
        await wait_for(pilot, lambda: any(n.title == "Cannot send" for n in app._notifications))
        assert prompt.text == "z" * 200 and len(engine.calls) == 1
        assert [m.content for m in chat(app).current.messages] == ["a" * 10, "r1"]
        assert [m.role for m in app.store.get_conversation(chat(app).current.id).messages] \
            == ["user", "assistant"]
        prompt.text = ""
        await type_and_send(pilot, "b" * 5)
        await wait_for(pilot, lambda: len(engine.calls) == 2)
        assert decode_ids(engine.calls[1]["ids"]) == \
            f"user:{'a' * 10}|assistant:r1|user:{'b' * 5}|assistant:"
