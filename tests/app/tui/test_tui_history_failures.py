"""A corrupt or read-only ``history.db`` never takes the TUI down (issue 18).

Reproduced with real SQLite failures: a database file whose pages are overwritten with random
bytes ("database disk image is malformed"), and a store whose connection is read-only
("attempt to write a readonly database"). References: the text the user typed and the fake
engine's deltas (the conversation in memory and the exported Markdown must hold them), the
file's path (the banner must name it).
"""

from __future__ import annotations

import os
import random
import sqlite3

from localchat.app.store import default_path
from localchat.app.tui.history import TuiStore
from localchat.app.tui.history_guard import open_tui_store
from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.screens.text_prompt import TextPromptScreen
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.sidebar import ConversationItem
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine

PAGE = 4096


def chat(app) -> ChatScreen:
    assert isinstance(app.screen, ChatScreen)
    return app.screen


async def send(pilot, text: str) -> None:
    chat(pilot.app).query_one(PromptInput).focus()
    await pilot.press(*[{" ": "space"}.get(c, c) for c in text])
    await pilot.press("enter")


def corrupt_history() -> str:
    """A real history.db with 30 conversations, every other page after the first two
    overwritten with random bytes (the header page stays, so it still opens)."""
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with TuiStore(path) as store:
        for i in range(30):
            conv = store.create_conversation("m", None, {}, title=f"t{i}")
            store.add_message(conv.id, "user", "hello world " * 50)
    size = os.path.getsize(path)
    rng = random.Random(0)
    with open(path, "r+b") as f:
        for page in range(2, size // PAGE, 2):
            f.seek(page * PAGE)
            f.write(rng.randbytes(PAGE))
    return str(path)


async def _chat_goes_on_and_exports(app, pilot, path: str, tmp_path) -> None:
    await send(pilot, "keep me")
    await wait_for(pilot, lambda: len(chat(app).current.messages) == 2, what="the reply")
    state = chat(app).current
    assert [(m.role, m.content) for m in state.messages] == [("user", "keep me"),
                                                           ("assistant", "kept reply")]
    assert [v.text for v in chat(app).query_one(ChatLog).views()] == ["keep me", "kept reply"]
    banner = chat(app).query_one("#history-banner")
    assert banner.display and banner.has_class("-visible")
    assert path in str(banner.render())
    assert app.store.problem is not None
    # A second turn works too, and the banner stays.
    await send(pilot, "again")
    await wait_for(pilot, lambda: len(chat(app).current.messages) == 4, what="reply two")
    assert banner.display
    # Export from memory.
    target = tmp_path / "saved.md"
    await pilot.press("ctrl+t")
    await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen))
    app.screen.query_one("#value").value = str(target)
    await pilot.press("enter")
    await wait_for(pilot, target.exists, what="the export")
    text = target.read_text(encoding="utf-8")
    for part in ("## User\n\nkeep me", "## Assistant\n\nkept reply", "## User\n\nagain"):
        assert part in text
    assert app.is_running and isinstance(app.screen, ChatScreen)


async def test_corrupt_history_keeps_the_tui_running(make_app, tmp_path):
    path = corrupt_history()
    with sqlite3.connect(path) as db:  # the reference: SQLite itself calls it corrupt
        try:
            db.execute("SELECT count(*) FROM messages").fetchall()
            raise AssertionError("the file is not corrupt")
        except sqlite3.DatabaseError as exc:
            assert "malformed" in str(exc)
    engine = GatedEngine([["kept reply"], ["second"]], gated=False)
    app = make_app(engine, store=open_tui_store())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+b")  # listing the history fails: no crash, an empty list
        await pilot.pause()
        await pilot.press("ctrl+b")
        await _chat_goes_on_and_exports(app, pilot, path, tmp_path)


async def test_read_only_history_keeps_the_tui_running(make_app, tmp_path):
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with TuiStore(path) as store:
        old = store.create_conversation("m", None, {}, title="Old one")
        store.add_message(old.id, "user", "from before")
    store = TuiStore(path)
    store._db.close()  # as if the file or its folder had become read-only
    store._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                                check_same_thread=False)
    store._db.row_factory = sqlite3.Row
    engine = GatedEngine([["kept reply"], ["second"]], gated=False)
    app = make_app(engine, store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await _chat_goes_on_and_exports(app, pilot, str(path), tmp_path)
        assert "readonly" in app.store.problem
        # Reads still work on a read-only file: the old conversation is listed and opens.
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: chat(app).query(ConversationItem), what="the list")
        assert [i.conversation_id for i in chat(app).query(ConversationItem)] == [old.id]
        await chat(app).open_conversation(old.id)
        assert [m.content for m in chat(app).current.messages] == ["from before"]


async def test_history_that_cannot_be_opened_shows_the_banner_at_start(make_app, tmp_path):
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database, " * 400)
    engine = GatedEngine([["kept reply"], ["second"]], gated=False)
    app = make_app(engine, store=open_tui_store())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert chat(app).query_one("#history-banner").display
        await _chat_goes_on_and_exports(app, pilot, str(path), tmp_path)


async def test_a_conversation_deleted_elsewhere_goes_on_in_memory(make_app, tmp_path):
    """The open conversation is deleted by another localchat (``history rm``, another TUI):
    the next message, its reply, a regeneration and a settings save no longer crash the app
    (``ConversationNotFoundError``); the chat goes on in memory and says so once."""
    path = tmp_path / "history.db"
    app = make_app(GatedEngine(gated=False), store=open_tui_store(path))
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "first")
        await wait_for(pilot, lambda: chat(pilot.app).current.id is not None
                       and len(chat(pilot.app).current.messages) == 2, what="the first turn")
        conv_id = chat(app).current.id
        other = TuiStore(path)  # another process's handle on the same file
        other.delete_conversation(conv_id)
        await send(pilot, "second")
        await wait_for(pilot, lambda: len(chat(pilot.app).current.messages) == 4,
                       what="the second turn")
        assert [m.content for m in chat(app).current.messages[::2]] == ["first", "second"]
        await pilot.press("ctrl+r")  # regenerate: deletes the last reply from the history
        await wait_for(pilot, lambda: len(chat(pilot.app).current.messages) == 4
                       and chat(pilot.app).current.turn is None, what="the regeneration")
        lost = [n for n in app._notifications if n.title == "Conversation deleted"]
        assert len(lost) == 1 and "no longer saved" in lost[0].message
        assert isinstance(app.screen, ChatScreen) and app.store.lost == {conv_id}
        assert other.list_conversations() == []  # nothing of it written back
