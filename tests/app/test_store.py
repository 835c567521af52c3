"""History store: schema round trips, titles, ids, search (FTS5 and the LIKE fallback),
exports, deletes, and two processes writing at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from localchat.app import store as store_mod
from localchat.app.store import ConversationNotFoundError, Store


@pytest.fixture
def db(tmp_path):
    with Store(tmp_path / "history.db") as s:
        yield s


def test_round_trip_and_title_from_first_user_message(db):
    conv = db.create_conversation("smollm2-135m", "Be brief.", {"temperature": 0.0})
    assert conv.title == "" and conv.message_count == 0
    db.add_message(conv.id, "user", "\n  How do I list files?\nwith details\n")
    db.add_message(conv.id, "assistant", "Use ls -l.", stats={"usage": {"prompt_tokens": 9}})
    db.add_message(conv.id, "user", "A second question")
    db.add_message(conv.id, "assistant", "partial", interrupted=True)
    got = db.get_conversation(conv.id)
    assert got.title == "How do I list files?"
    assert (got.model, got.system_prompt, got.sampling) == (
        "smollm2-135m", "Be brief.", {"temperature": 0.0})
    assert [(m.role, m.content, m.interrupted) for m in got.messages] == [
        ("user", "\n  How do I list files?\nwith details\n", False),
        ("assistant", "Use ls -l.", False), ("user", "A second question", False),
        ("assistant", "partial", True)]
    assert got.messages[1].stats == {"usage": {"prompt_tokens": 9}}
    assert got.message_count == 4 and got.updated >= got.created
    long = db.create_conversation()
    db.add_message(long.id, "user", "x" * 200)
    title = db.get_conversation(long.id).title
    assert len(title) == store_mod.TITLE_CHARS and title.endswith("…")


def test_delete_message_keeps_the_rest_and_drops_an_emptied_conversation(db):
    conv = db.create_conversation("m")
    first = db.add_message(conv.id, "user", "kept question")
    db.add_message(conv.id, "assistant", "kept answer")
    refused = db.add_message(conv.id, "user", "a refused turn about zebras")
    assert db.delete_message(refused.id) is False  # the conversation stays
    got = db.get_conversation(conv.id)
    assert [m.content for m in got.messages] == ["kept question", "kept answer"]
    assert db.search("zebras") == []  # the search index follows the delete
    alone = db.create_conversation("m")
    only = db.add_message(alone.id, "user", "the only message")
    assert db.delete_message(only.id) is True
    with pytest.raises(ConversationNotFoundError):
        db.get_conversation(alone.id)
    assert db.delete_message(only.id) is False  # already gone: nothing to delete
    assert [c.id for c in db.list_conversations()] == [conv.id]
    assert first.id in [m.id for m in db.get_conversation(conv.id).messages]


def test_list_order_most_recent_rename_and_prefix_ids(db):
    a = db.create_conversation(title="a")
    b = db.create_conversation(title="b")
    db.add_message(a.id, "user", "later")  # a becomes the most recent
    assert [c.id for c in db.list_conversations()] == [a.id, b.id]
    assert db.most_recent().id == a.id and db.most_recent().messages[0].content == "later"
    db.rename_conversation(b.id, "renamed")
    assert db.list_conversations(limit=1)[0].title == "renamed"
    # b (renamed last) is the most recent, but only a has a message to continue (ask -c)
    assert db.most_recent().id == b.id and db.most_recent(with_messages=True).id == a.id
    assert db.get_conversation(b.id[:5]).id == b.id
    with pytest.raises(ConversationNotFoundError, match="no conversation 'nope'"):
        db.get_conversation("nope")
    with pytest.raises(ConversationNotFoundError):
        db.resolve_id("")
    with pytest.raises(ConversationNotFoundError):
        db.add_message("nope", "user", "x")
    with pytest.raises(ValueError, match="role"):
        db.add_message(a.id, "robot", "x")


def test_ambiguous_prefix(db, monkeypatch):
    ids = iter(["abc111" + "0" * 26, "abc222" + "0" * 26])
    monkeypatch.setattr(store_mod.uuid, "uuid4", lambda: type("U", (), {"hex": next(ids)})())
    db.create_conversation()
    db.create_conversation()
    with pytest.raises(ConversationNotFoundError, match="ambiguous"):
        db.resolve_id("abc")
    assert db.resolve_id("abc2") == "abc222000000"


def test_search_finds_words_from_past_replies(db):
    cats = db.create_conversation()
    db.add_message(cats.id, "user", "Tell me about cats")
    db.add_message(cats.id, "assistant", "Cats are small carnivorous mammals; they purr.")
    dogs = db.create_conversation()
    db.add_message(dogs.id, "user", "And dogs?")
    db.add_message(dogs.id, "assistant", 'Dogs bark. "Quoted" words and beast-like AND OR *')
    assert db.fts
    hits = db.search("purr")
    assert [(h.conversation_id, h.role) for h in hits] == [(cats.id, "assistant")]
    assert "\x02purr\x03" in hits[0].snippet
    assert {h.conversation_id for h in db.search("carnivorous MAMMALS")} == {cats.id}
    assert db.search("cats dogs") == []  # every word must match in one message
    assert [h.role for h in db.search("dog")] == ["assistant", "user"]  # stemming, newest first
    for query in ('"quoted', "beast-like", "AND", "*", "OR ("):  # FTS syntax taken literally
        db.search(query)
    assert db.search("beast-like")[0].conversation_id == dogs.id
    assert db.search("   ") == []
    db.delete_conversation(cats.id)
    assert db.search("purr") == []  # the index follows deletes
    with pytest.raises(ConversationNotFoundError):
        db.delete_conversation(cats.id)


def test_search_finds_emoji_and_part_of_a_cjk_run(db):
    """What the FTS5 index cannot find (emoji: separators to its tokenizer; part of a run of
    a script written without spaces) is matched as a substring (a trial found neither);
    ``café`` still goes through the index."""
    food = db.create_conversation()
    db.add_message(food.id, "user", "pizza \U0001f355\U0001f1eb\U0001f1f7 and \u65e5\u672c\u8a9e")
    other = db.create_conversation()
    db.add_message(other.id, "user", "un caf\u00e9, s'il vous pla\u00eet \u2615")
    for query in ("\U0001f355", "\U0001f355\U0001f1eb\U0001f1f7", "\u65e5\u672c",
                  "\u65e5\u672c\u8a9e", "pizza \u672c"):
        assert [h.conversation_id for h in db.search(query)] == [food.id], query
    assert [h.conversation_id for h in db.search("\u2615")] == [other.id]
    assert [h.conversation_id for h in db.search("caf\u00e9")] == [other.id]
    assert "\x02" in db.search("caf\u00e9")[0].snippet  # (the index's marked snippet)
    assert db.search("\U0001f355 caf\u00e9") == []  # every word in one message
    # a word the index finds and one it cannot, together: stemming kept for the first
    db.add_message(food.id, "assistant", "Dragons like 100% of snake_case c++ code \U0001f409")
    assert [h.role for h in db.search("dragon \U0001f409")] == ["assistant"]
    for query in ("100%", "snake_case", "c++", "dragon c++", "% of"):  # literal, not wildcards
        assert [h.role for h in db.search(query)] == ["assistant"], query
    assert db.search("_") and db.search("50%") == [] and db.search("snake%case") == []


def test_a_limit_past_sqlites_integers_means_all(db):
    """``history list -n 99999999999999999999`` was an internal error (OverflowError from
    SQLite's binding; a new-user trial); such a limit now lists everything."""
    ids = []
    for word in ("alpha", "beta", "gamma"):
        conv = db.create_conversation()
        db.add_message(conv.id, "user", f"{word} shared")
        ids.append(conv.id)
    assert [c.id for c in db.list_conversations(limit=10**20)] == ids[::-1]
    assert [c.id for c in db.list_conversations(limit=2)] == ids[:0:-1]
    assert len(db.search("shared", limit=10**20)) == 3


def test_like_fallback_without_fts5(tmp_path, monkeypatch):
    monkeypatch.setattr(Store, "_init_fts", lambda self: False)
    with Store(tmp_path / "plain.db") as db:
        conv = db.create_conversation()
        db.add_message(conv.id, "assistant", "100% sure_thing about Paris")
        assert not db.fts
        with pytest.warns(UserWarning, match="no FTS5"):
            assert [h.conversation_id for h in db.search("paris 100%")] == [conv.id]
        with pytest.warns(UserWarning):
            assert db.search("sure%thing") == []  # % is literal, not a wildcard


def test_exports(db):
    conv = db.create_conversation("m", "Sys", {"temperature": 0.5})
    db.add_message(conv.id, "user", "Q? é")
    db.add_message(conv.id, "assistant", "A!", interrupted=True)
    data = json.loads(db.export_json(conv.id))
    assert data["id"] == conv.id and data["model"] == "m" and data["system_prompt"] == "Sys"
    assert [(m["role"], m["content"], m["interrupted"]) for m in data["messages"]] == [
        ("user", "Q? é", False), ("assistant", "A!", True)]
    assert data["created"].endswith("Z") and data["sampling"] == {"temperature": 0.5}
    md = db.export_markdown(conv.id)
    assert md.startswith("# Q? é\n")
    assert "## System\n\nSys\n" in md and "## User\n\nQ? é\n" in md
    assert "## Assistant (interrupted)\n\nA!\n" in md and md.endswith("A!\n")


def test_not_a_database(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(store_mod.HistoryUnavailable, match="cannot be used .*not a database"):
        Store(bad)


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from localchat.app.store import Store
    path, name, shared, go = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    with Store(path) as db:
        own = db.create_conversation(title=name)
        while not go.exists():
            time.sleep(0.01)
        for i in range(60):
            db.add_message(own.id, "user", f"{name} message {i}")
            db.add_message(shared, "assistant", f"{name} shared {i}")
""")


def test_two_processes_writing_at_once_both_succeed(tmp_path):
    path = tmp_path / "history.db"
    with Store(path) as db:
        shared = db.create_conversation(title="shared").id
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, shared, str(go)],
                              stderr=subprocess.PIPE) for name in ("alpha", "beta")]
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    with Store(path) as db:
        convs = {c.title: c for c in db.list_conversations()}
        assert convs["alpha"].message_count == convs["beta"].message_count == 60
        msgs = db.get_conversation(shared).messages
        assert len(msgs) == 120
        for name in ("alpha", "beta"):  # each writer's messages in its own order
            mine = [m.content for m in msgs if m.content.startswith(name)]
            assert mine == [f"{name} shared {i}" for i in range(60)]
        assert len(db.search("shared", limit=500)) == 120


def test_history_search_without_fts5_warns_once_on_stderr(tmp_path, monkeypatch, capsys):
    from localchat.app import cli, cli_io

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Store, "_init_fts", lambda self: False)
    with Store() as db:
        conv = db.create_conversation()
        db.add_message(conv.id, "assistant", "Paris is the capital")
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["history", "search", "capital"])
    out = capsys.readouterr()
    assert code == 0 and out.out == f"{conv.id}  assistant  Paris is the capital\n"
    assert out.err == "localchat: warning: this SQLite has no FTS5; searching by substring\n"


def test_a_file_without_parent_id_is_migrated_and_keeps_its_messages(tmp_path):
    import sqlite3

    from localchat.app.store_schema import SCHEMA

    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA.replace(",\n    parent_id INTEGER", ""))
    old.execute("INSERT INTO conversations VALUES ('c1', 't', NULL, NULL, '{}', 1, 1)")
    old.execute("INSERT INTO messages (conversation_id, role, content, created) "
                "VALUES ('c1', 'user', 'old question', 1)")
    old.commit()
    old.close()
    with Store(path) as store:
        store.add_message("c1", "assistant", "new answer", parent_id=1)
        msgs = store.get_conversation("c1").messages
    assert [(m.content, m.parent_id) for m in msgs] == [("old question", None), ("new answer", 1)]


def test_a_new_history_file_is_the_users_alone(tmp_path):
    """The conversations are private: a new database file (the default one, and a repaired
    copy, which ``Store`` creates too) is mode 0600 whatever the umask; an existing file
    keeps its mode."""
    import os

    old = os.umask(0o022)
    try:
        with Store(tmp_path / "history.db") as s:
            s.create_conversation("m", None, {})
        assert (tmp_path / "history.db").stat().st_mode & 0o777 == 0o600
        theirs = tmp_path / "shared.db"
        theirs.touch(mode=0o644)
        theirs.chmod(0o644)
        Store(theirs).close()
        assert theirs.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)
