"""The chat screen driven with Pilot against a gated fake engine (tests/app/tui/fake_async_engine).

References are independent of the TUI: the prompt ids the engine received decode (through the
character tokenizer) to the conversation the user typed; the history rows are read back from
the store; the streamed text equals the concatenated deltas the engine sent.
"""

from __future__ import annotations

from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.message_view import MessageView
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.status_bar import StatusBar
from tests.app.fake_engine import decode_ids
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine


def chat(app) -> ChatScreen:
    screen = app.screen
    assert isinstance(screen, ChatScreen)
    return screen


def stored(app, cid):
    return [(m.role, m.content, m.interrupted) for m in app.store.get_conversation(cid).messages]


async def type_and_send(pilot, text: str) -> None:
    pilot.app.screen.query_one(PromptInput).focus()
    await pilot.press(*[{" ": "space"}.get(c, c) for c in text])
    await pilot.press("enter")


async def test_send_and_stream(make_app):
    deltas = ["Hel", "lo ", "**there**"]
    engine = GatedEngine([deltas])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "hi you")
        await wait_for(pilot, lambda: len(engine.calls) == 1, what="the request")
        # The user's message is in the history before any token arrives.
        cid = chat(app).current.id
        assert stored(app, cid) == [("user", "hi you", False)]
        assert decode_ids(engine.calls[0]["ids"]) == "user:hi you|assistant:"
        engine.release(2)
        live = lambda: chat(app).query_one(ChatLog).views()[-1]
        await wait_for(pilot, lambda: live().text == "Hello ", what="two deltas shown")
        assert chat(app).current.streaming
        assert chat(app).query_one(StatusBar).info.state == "streaming"
        engine.release(1)
        await wait_for(pilot, lambda: not chat(app).current.streaming, what="the end")
        assert stored(app, cid) == [("user", "hi you", False),
                                    ("assistant", "".join(deltas), False)]
        view = live()
        assert view.markdown.source == "".join(deltas)  # the final full update
        assert not view.has_class("-interrupted")
        reply = app.store.get_conversation(cid).messages[-1]
        assert reply.stats["usage"]["completion_tokens"] == len(deltas)


async def test_stop_mid_reply_keeps_partial_marked(make_app):
    engine = GatedEngine([["one ", "two ", "three ", "four"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "count")
        engine.release(2)
        await wait_for(pilot, lambda: engine.emitted == 2, what="two deltas")
        await wait_for(pilot, lambda: chat(app).query_one(ChatLog).views()[-1].text
                       == "one two ")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not chat(app).current.streaming, what="the stop")
        await wait_for(pilot, lambda: engine.aborted, what="the abort")
        cid = chat(app).current.id
        assert stored(app, cid)[-1] == ("assistant", "one two ", True)
        view = chat(app).query_one(ChatLog).views()[-1]
        assert view.has_class("-interrupted") and view.text == "one two "
        assert engine.aborted == [engine.calls[0]["request_id"]]
        # Reopening the conversation restores the partial reply, still marked.
        await chat(app).open_conversation(cid)
        await pilot.pause()
        views = chat(app).query_one(ChatLog).views()
        assert [(v.role, v.text, v.interrupted) for v in views] == [
            ("user", "count", False), ("assistant", "one two ", True)]


async def test_ctrl_c_stops_too(make_app):
    engine = GatedEngine([["a", "b", "c"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "x")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 1)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not chat(app).current.streaming)
        assert stored(app, chat(app).current.id)[-1] == ("assistant", "a", True)


async def test_regenerate_replaces_last_reply(make_app):
    engine = GatedEngine([["first"], ["second"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "q")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(engine.calls) == 2 and not chat(app).current.streaming)
        cid = chat(app).current.id
        assert engine.calls[1]["ids"] == engine.calls[0]["ids"]  # same prompt again
        assert stored(app, cid) == [("user", "q", False), ("assistant", "second", False)]
        views = chat(app).query_one(ChatLog).views()
        assert [(v.role, v.text) for v in views] == [("user", "q"), ("assistant", "second")]


async def test_edit_last_message_and_resend(make_app):
    engine = GatedEngine([["r1"], ["r2"], ["r3"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "a")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        await type_and_send(pilot, "b")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4)
        await pilot.press("ctrl+e")
        prompt = chat(app).query_one(PromptInput)
        assert prompt.text == "b"
        await pilot.press("c", "enter")  # the cursor is at the end (it was at the start)
        await wait_for(pilot, lambda: len(engine.calls) == 3 and not chat(app).current.streaming)
        cid = chat(app).current.id
        assert stored(app, cid) == [("user", "a", False), ("assistant", "r1", False),
                                    ("user", "bc", False), ("assistant", "r3", False)]
        assert decode_ids(engine.calls[2]["ids"]) == "user:a|assistant:r1|user:bc|assistant:"
        assert app.store.search("r2") == []  # the replaced reply left the FTS index too


async def test_edit_last_keeps_an_unsent_draft(make_app):
    """Ctrl+E puts the last message in the prompt; the draft it replaced comes back on Esc
    (edit cancelled) and after the edit is sent: nothing typed is lost. A second Ctrl+E while
    editing keeps the rewrite (it put the original back: a second trial)."""
    engine = GatedEngine([["r1"], ["r2"], ["r3"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "a")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        prompt = chat(app).query_one(PromptInput)
        await pilot.press(*"draft")
        await pilot.press("ctrl+e")
        assert prompt.text == "a"
        await pilot.press("escape")
        assert prompt.text == "draft"
        await pilot.press("ctrl+e", "end", "b", "enter")
        await wait_for(pilot, lambda: len(engine.calls) == 2 and not chat(app).current.streaming)
        assert [m.content for m in chat(app).current.messages] == ["ab", "r2"]
        assert prompt.text == "draft"
        await pilot.press("ctrl+e", *"xyz")
        assert prompt.text == "abxyz"
        await pilot.press("ctrl+e")
        assert prompt.text == "abxyz"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engine.calls) == 3 and not chat(app).current.streaming)
        assert [m.content for m in chat(app).current.messages] == ["abxyz", "r3"]


async def test_switch_conversation_during_stream(make_app):
    engine = GatedEngine([["A1 ", "A2 ", "A3"], ["B1"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "alpha")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 1)
        first = chat(app).current
        await pilot.press("ctrl+n")  # a new conversation while A streams
        await wait_for(pilot, lambda: chat(app).current is not first)
        # The UI takes input while A is still streaming.
        await type_and_send(pilot, "beta")
        await wait_for(pilot, lambda: len(engine.calls) == 2)
        assert first.streaming
        engine.release(1)  # one more delta: for A (first waiter) or B
        engine.open_gate()
        await wait_for(pilot, lambda: not first.streaming and not chat(app).current.streaming)
        second = chat(app).current
        assert stored(app, first.id) == [("user", "alpha", False),
                                         ("assistant", "A1 A2 A3", False)]
        assert stored(app, second.id) == [("user", "beta", False), ("assistant", "B1", False)]
        assert decode_ids(engine.calls[1]["ids"]) == "user:beta|assistant:"
        # B's view never showed A's text.
        assert [v.text for v in chat(app).query_one(ChatLog).views()] == ["beta", "B1"]
        await chat(app).open_conversation(first.id)
        await pilot.pause()
        assert [v.text for v in chat(app).query_one(ChatLog).views()] == ["alpha", "A1 A2 A3"]


async def test_reopen_while_streaming_reattaches(make_app):
    engine = GatedEngine([["x1 ", "x2 ", "x3"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "go")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 1)
        cid = chat(app).current.id
        await pilot.press("ctrl+n")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 2)
        await chat(app).open_conversation(cid)
        await wait_for(pilot, lambda: chat(app).query_one(ChatLog).views()[-1].text == "x1 x2 ")
        engine.release(1)
        await wait_for(pilot, lambda: not chat(app).current.streaming)
        view = chat(app).query_one(ChatLog).views()[-1]
        assert view.text == "x1 x2 x3" and view.markdown.source == "x1 x2 x3"


async def test_second_turn_shows_cached_tokens(make_app):
    engine = GatedEngine([["first reply"], ["ok"]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await type_and_send(pilot, "tell me something long enough")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        assert chat(app).query_one(StatusBar).info.cached_tokens == 0
        await type_and_send(pilot, "and more")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4)
        info = chat(app).query_one(StatusBar).info
        ids1, ids2 = engine.calls[0]["ids"], engine.calls[1]["ids"]
        shared = next((i for i, (a, b) in enumerate(zip(ids1, ids2)) if a != b), len(ids1))
        assert info.cached_tokens == shared // 16 * 16 > 0
        assert f"cached {info.cached_tokens}/{len(ids2)}" in chat(app).query_one(StatusBar).plain


async def test_copy_reply_and_code_block(make_app):
    reply = "Try:\n\n```sh\nls -la\n```\n\nor\n\n```py\nprint(2)\n```\n"
    engine = GatedEngine([[reply]], gated=False)
    app = make_app(engine)
    copied = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
    async with app.run_test(size=(100, 40)) as pilot:
        await type_and_send(pilot, "how")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        await pilot.press("ctrl+y", "ctrl+k", "ctrl+k")
        await pilot.pause()
        assert copied == [reply, "ls -la", "print(2)"]


async def test_engine_error_is_a_notification(make_app):
    from localchat.engine.errors import ContextLengthError

    engine = GatedEngine(fail_with=ContextLengthError("the prompt is too long for the model"))
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "hello")
        await wait_for(pilot, lambda: app._notifications and not chat(app).current.streaming)
        texts = [n.message for n in app._notifications]
        assert any("the prompt is too long" in t for t in texts)
        cid = chat(app).current.id
        assert stored(app, cid) == [("user", "hello", False)]  # the message is kept
        assert app.is_running


async def test_regenerate_answers_a_message_left_without_reply(make_app):
    from localchat.engine.errors import LocalchatError

    engine = GatedEngine([["fine"]], gated=False, fail_with=LocalchatError("engine hiccup"))
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "hello")
        await wait_for(pilot, lambda: app._notifications and not chat(app).current.streaming)
        cid = chat(app).current.id
        assert stored(app, cid) == [("user", "hello", False)]
        engine.fail_with = None
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        assert stored(app, cid) == [("user", "hello", False), ("assistant", "fine", False)]
        assert engine.calls[1]["ids"] == engine.calls[0]["ids"]


async def test_model_load_failure_is_a_notification(make_app):
    from localchat.engine.errors import ModelNotFoundError

    def loader(spec, **kwargs):
        raise ModelNotFoundError(f"unknown model '{spec}'")

    app = make_app(None, engine_loader=loader, model="no-such-model")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.engine_error is not None, what="the failure")
        assert app.engine_error == "unknown model 'no-such-model'"
        assert any("unknown model" in n.message for n in app._notifications)
        assert chat(app).query_one(StatusBar).info.state == "error"
        await type_and_send(pilot, "hi")
        await pilot.pause()
        assert chat(app).query_one(PromptInput).text == "hi"  # kept for later
        assert chat(app).current.id is None


async def test_narrow_terminal(make_app):
    engine = GatedEngine([["a reply that is long enough to wrap " * 3]], gated=False)
    app = make_app(engine)
    async with app.run_test(size=(60, 20)) as pilot:
        await type_and_send(pilot, "hi")
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        bar = chat(app).query_one(StatusBar)
        assert bar.region.width == 60 and len(bar.plain) <= 58
        assert "cached" in bar.plain or "c 0" in bar.plain
        for view in chat(app).query(MessageView):
            assert view.region.right <= 60
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert chat(app).query_one("#chat-pane").region.width > 0


async def test_help_lists_remapped_keys(make_app):
    from localchat.app.settings import Settings
    from localchat.app.tui.screens.help_screen import HelpScreen

    engine = GatedEngine([["a", "b", "c"]])
    app = make_app(engine, settings=Settings(keys={"stop": "ctrl+g"}))
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "x")
        engine.release(1)
        await wait_for(pilot, lambda: engine.emitted == 1)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: not chat(app).current.streaming)
        assert stored(app, chat(app).current.id)[-1] == ("assistant", "a", True)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one("DataTable")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert ["stop", "ctrl+g", "Stop reply"] in [list(map(str, r)) for r in rows]


async def test_follows_the_reply_only_at_the_bottom(make_app):
    lines = [f"line {i}\n\n" for i in range(36)]
    engine = GatedEngine([lines])
    app = make_app(engine)
    async with app.run_test(size=(80, 20)) as pilot:
        await type_and_send(pilot, "lines")
        log = chat(app).query_one(ChatLog)
        engine.release(20)
        await wait_for(pilot, lambda: "line 19" in log.views()[-1].markdown.source)
        await wait_for(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y,
                       what="following at the bottom")
        log.focus()
        await pilot.press("pageup")
        await wait_for(pilot, lambda: log.scroll_y < log.max_scroll_y)
        await pilot.wait_for_scheduled_animations()  # page up scrolls smoothly: let it land
        held = log.scroll_y
        engine.release(8)
        await wait_for(pilot, lambda: "line 27" in log.views()[-1].markdown.source)
        await pilot.pause()
        assert round(log.scroll_y) == round(held) < log.max_scroll_y  # the position is kept
        await pilot.press("end")
        engine.release(8)
        await wait_for(pilot, lambda: not chat(app).current.streaming)
        await wait_for(pilot, lambda: log.scroll_y == log.max_scroll_y, what="following again")


async def test_dropped_turns_notice(make_app):
    from localchat.app.settings import Settings

    engine = GatedEngine([["r1"], ["r2"]], gated=False, max_model_len=96)
    app = make_app(engine, settings=Settings(sampling={"max_tokens": 16}))
    async with app.run_test(size=(100, 30)) as pilot:
        await type_and_send(pilot, "a" * 40)
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 2)
        notice = chat(app).query_one("#notice")
        assert not notice.has_class("-visible")
        await type_and_send(pilot, "b" * 30)
        await wait_for(pilot, lambda: len(chat(app).current.messages) == 4)
        # 96 - 16 = 80 prompt tokens: the first turn (49 + 13 characters) no longer fits.
        assert decode_ids(engine.calls[1]["ids"]) == f"user:{'b' * 30}|assistant:"
        assert notice.has_class("-visible")
        assert "1 earlier turn left out" in str(notice.render())


async def test_newline_keys_and_a_refused_send_keeps_the_text(make_app):
    engine = GatedEngine([["one", "two"]])
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        chat(app).query_one(PromptInput).focus()
        await pilot.press("a", "ctrl+j", "b", "enter")
        await wait_for(pilot, lambda: len(engine.calls) == 1)
        assert chat(app).current.messages[0].content == "a\nb"
        assert decode_ids(engine.calls[0]["ids"]) == "user:a\nb|assistant:"
        prompt = chat(app).query_one(PromptInput)
        assert prompt.text == ""
        await pilot.press("x", "y", "enter")  # a reply is streaming: refused, kept
        await pilot.pause()
        assert prompt.text == "xy" and len(engine.calls) == 1
        assert any("still streaming" in n.message for n in app._notifications)
        engine.open_gate()
        await wait_for(pilot, lambda: not chat(app).current.streaming)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engine.calls) == 2)
        assert prompt.text == "" and chat(app).current.messages[2].content == "xy"
