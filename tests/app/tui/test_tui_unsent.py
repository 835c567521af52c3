"""Text typed but not sent survives a quit (a new-user trial: Ctrl+Q threw a draft away)."""

from __future__ import annotations

from localchat.app.tui.history import TuiStore
from localchat.app.tui.unsent import FILE_NAME, Unsent, load_unsent, save_unsent
from localchat.app.tui.widgets.prompt_input import PromptInput
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine
from tests.app.tui.test_tui_history import chat, seed


async def type_text(pilot, text: str) -> None:
    await pilot.press(*[{" ": "space"}.get(c, c) for c in text])


async def type_in(pilot, app, conv_id: str, text: str) -> None:
    """Open conversation ``conv_id`` and type ``text`` into the prompt."""
    await chat(app).open_conversation(conv_id)
    chat(app).query_one(PromptInput).focus()
    await type_text(pilot, text)


async def test_ctrl_q_keeps_the_draft_for_the_next_start(make_app, tmp_path):
    store_path = tmp_path / "history.db"
    app = make_app(GatedEngine(gated=False), store=TuiStore(store_path))
    conv_id = seed(app.store, "First", [("q1", "a1")])
    async with app.run_test(size=(100, 30)) as pilot:
        await type_in(pilot, app, conv_id, "my long draft")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the quit")
    again = make_app(GatedEngine(gated=False), store=TuiStore(store_path))
    async with again.run_test(size=(100, 30)) as pilot:
        prompt = chat(again).query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.text == "my long draft", what="the draft back")
        assert chat(again).current.id == conv_id  # in the conversation it was typed in
        assert [m.content for m in chat(again).current.messages] == ["q1", "a1"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(chat(again).current.messages) == 4, what="the reply")
    # sent, then quit with an empty prompt: nothing comes back
    third = make_app(GatedEngine(gated=False), store=TuiStore(store_path))
    async with third.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert chat(third).query_one(PromptInput).text == ""
        assert chat(third).current.id is None


async def test_a_draft_of_a_new_or_deleted_conversation_comes_back_in_a_new_one(make_app):
    save_unsent(Unsent("draft for a chat deleted since", "no-such-id"))
    app = make_app(GatedEngine(gated=False))
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = chat(app).query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.text == "draft for a chat deleted since")
        assert chat(app).current.id is None
        assert any("unsent message" in str(n.message) for n in app._notifications)


def test_the_unsent_file_round_trips_and_tolerates_damage(isolated_home):
    save_unsent(Unsent("two\nlines", None))
    assert load_unsent() == Unsent("two\nlines", None)
    save_unsent(None)
    assert load_unsent() is None
    path = isolated_home / "data" / FILE_NAME
    path.write_text("{not json", encoding="utf-8")
    assert load_unsent() is None


async def test_an_empty_quit_keeps_another_tuis_draft(make_app):
    """Two TUIs on one history: B quits with a draft, then A (which restored nothing) quits
    with an empty prompt. A's quit removed B's draft; it keeps it now."""
    app = make_app(GatedEngine(gated=False))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        save_unsent(Unsent("B's draft", None))  # B quits meanwhile
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, what="the quit")
    assert load_unsent() == Unsent("B's draft", None)


async def test_a_quit_during_an_untouched_edit_keeps_only_the_draft(make_app, tmp_path):
    """Ctrl+E then Ctrl+Q brought the message already sent back as "unsent" (merged with the
    draft set aside): a quit now ends the edit as Esc does; an untouched rewrite is not kept,
    a changed one is."""
    store_path = tmp_path / "history.db"
    for extra, want in (("", "my draft"), ("!", "my draft\n\nq1!")):
        save_unsent(None)  # each round starts with nothing kept
        app = make_app(GatedEngine(gated=False), store=TuiStore(store_path))
        conv_id = seed(app.store, "First", [("q1", "a1")])
        async with app.run_test(size=(100, 30)) as pilot:
            await type_in(pilot, app, conv_id, "my draft")
            await pilot.press("ctrl+e")
            prompt = chat(app).query_one(PromptInput)
            await wait_for(pilot, lambda p=prompt: p.text == "q1", what="the edit")
            if extra:
                await type_text(pilot, extra)
            await pilot.press("ctrl+q")
            await wait_for(pilot, lambda a=app: not a.is_running, what="the quit")
        assert load_unsent() == Unsent(want, conv_id)
