"""The history must never take the app down (issue 18): a corrupt ``history.db``, a read-only
history, a full disk. ``ask`` still answers and says once on stderr that the turn is not saved
(naming the file and what to do); ``history list``/``search`` and ``ask -c`` give one error line
(exit 1), never ``internal error``; ``history check`` finds the damage and ``history repair``
salvages the readable rows into a new file. Subprocesses on the fake engine (``fake_cli.py``);
stdout and stderr are checked apart."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from localchat.app import store_repair
from localchat.app.store import HistoryUnavailable, Store, open_store

from .test_cli_fake import db, env, fake  # noqa: F401 - fixtures and helpers

PAGE = 4096


def history_path(env) -> Path:
    return Path(env["LOCALCHAT_HOME"]) / "data" / "history.db"


def fill_history(path: Path, n: int = 30) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store(path) as store:
        for i in range(n):
            conv = store.create_conversation("smollm2-135m")
            store.add_message(conv.id, "user", f"question {i} " + "words " * 300)
            store.add_message(conv.id, "assistant", f"answer {i} " + "more " * 300)


def corrupt_pages(path: Path, pages: list[int]) -> None:
    """Overwrite whole pages (1-based) with seeded random bytes."""
    rng = random.Random(18)
    with open(path, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * PAGE)
            f.write(bytes(rng.randrange(256) for _ in range(PAGE)))


def one_error_line(proc) -> str:
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("localchat: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    return err


def test_corrupt_history_ask_answers_commands_say_one_line_and_repair_salvages(env):
    path = history_path(env)
    fill_history(path)
    corrupt_pages(path, [5, 6, 7, 20])  # the messages table's root among them
    proc = fake(env, "ask", "still there?", FAKE_REPLY="Yes.")
    assert proc.returncode == 0 and proc.stdout == b"Yes.\n"
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("localchat: warning: this turn is not saved")
    assert str(path) in err and "history repair" in err and "malformed" in err
    for args in (["history", "list"], ["history", "search", "words"],
                 ["ask", "-c", "more"]):
        proc = fake(env, *args)
        assert proc.returncode == 1 and proc.stdout == b"", args
        assert str(path) in one_error_line(proc)
    check = fake(env, "history", "check")
    assert check.returncode == 1 and b"ok" not in check.stdout
    assert str(path).encode() in check.stdout and b"history repair" in check.stderr
    before = path.read_bytes()
    repair = fake(env, "history", "repair")
    assert repair.returncode == 0, repair.stderr
    # 30, plus the empty conversation the failed ask created (its message could not be added)
    assert repair.stderr.decode().startswith("localchat: note: salvaged 31 conversations")
    aside = [p for p in path.parent.glob("history.db.corrupt-*")
             if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == before  # the damaged file is kept
    assert fake(env, "history", "check").stdout.decode().strip() == f"{path}: ok"
    listed = fake(env, "history", "list")
    assert listed.returncode == 0 and listed.stdout.decode().count("smollm2-135m") == 31
    proc = fake(env, "ask", "saved now?", FAKE_REPLY="Yes.")
    assert proc.returncode == 0 and proc.stderr == b""


def test_repair_of_a_sound_file_changes_nothing_unless_forced(env):
    path = history_path(env)
    fill_history(path, n=3)
    before = path.read_bytes()
    repair = fake(env, "history", "repair")
    assert repair.returncode == 0 and "nothing to repair" in repair.stderr.decode()
    assert path.read_bytes() == before and not list(path.parent.glob("history.db.*-*"))
    forced = fake(env, "history", "repair", "--force")
    assert forced.returncode == 0
    assert forced.stderr.decode().startswith("localchat: note: salvaged 3 conversations and 6")
    assert len([p for p in path.parent.glob("history.db.corrupt-*")
                if not p.name.endswith(("-wal", "-shm"))]) == 1


def test_check_without_a_history_file_or_with_a_folder_sends_nowhere(env):
    """No history yet: ``check`` printed the path twice, exited 1 and sent the user to
    ``repair``, which then refused (exit 2) for lack of a file (a new-user trial). Now a
    missing file is "no history yet" (exit 0); a folder in its place is named, exit 1, with
    no pointer to a repair that cannot help."""
    path = history_path(env)
    if path.exists():
        path.unlink()
    proc = fake(env, "history", "check")
    assert proc.returncode == 0 and proc.stdout.decode().strip() == \
        f"{path}: no history yet (nothing to check)"
    path.mkdir(parents=True)
    proc = fake(env, "history", "check")
    out = proc.stdout.decode().strip()
    assert proc.returncode == 1 and out.count(str(path)) == 1 and "not a file" in out
    assert b"repair" not in proc.stderr
    path.rmdir()


def test_repair_keeps_every_row_on_readable_pages(tmp_path):
    path = tmp_path / "history.db"
    fill_history(path, n=40)
    with Store(path) as store:
        want = {c.id: [m.content for m in store.get_conversation(c.id).messages]
                for c in store.list_conversations()}
    pages = path.stat().st_size // PAGE
    corrupt_pages(path, [pages - 3, pages - 2])  # two leaf pages near the end
    assert store_repair.check(path)
    result = store_repair.repair(path)
    with Store(path) as store:
        got = {c.id: [m.content for m in store.get_conversation(c.id).messages]
               for c in store.list_conversations()}
    kept = sum(len(v) for v in got.values())
    assert 0 < kept < 80 and kept == result.messages
    assert result.lost_messages + result.messages >= 78
    for cid, contents in got.items():  # what was salvaged is exactly what was stored
        assert cid == "recovered0000" or set(contents) <= set(want[cid])


@pytest.mark.parametrize("mode, reason", [("readonly", "readonly database"),
                                          ("full", "database or disk is full")])
def test_read_only_or_full_history_ask_answers_and_says_so_once(env, mode, reason):
    assert fake(env, "ask", "first", FAKE_REPLY="One.").returncode == 0
    long_prompt = "éàü " * 900  # 3600 characters, 6300 bytes: needs new pages
    proc = fake(env, "ask", long_prompt, FAKE_REPLY="Two.", FAKE_DB=mode)
    assert proc.returncode == 0 and proc.stdout == b"Two.\n"
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("localchat: warning: this turn is not saved")
    assert reason in err and str(history_path(env)) in err
    with db(env) as store:  # nothing half-written
        assert [c.message_count for c in store.list_conversations()] == [2]


def test_open_store_falls_back_to_memory_with_the_reason(tmp_path):
    bad = tmp_path / "history.db"
    bad.write_bytes(b"not a database" * 300)
    with pytest.raises(HistoryUnavailable) as info:
        Store(bad)
    assert info.value.path == bad and "not a database" in info.value.reason
    store, error = open_store(bad)
    assert isinstance(error, HistoryUnavailable) and error.path == bad
    conv = store.create_conversation("m")  # the in-memory store works (and exports)
    store.add_message(conv.id, "user", "kept in memory")
    assert "kept in memory" in store.export_markdown(conv.id)
    store.close()
    good, error = open_store(tmp_path / "fresh.db")
    assert error is None and good.list_conversations() == []
    good.close()


def test_repair_that_salvages_nothing_says_so_and_fails(env):
    """A file whose tables cannot be read at all (here: its first 16 bytes, SQLite's header
    string, overwritten) is not a success: one line saying nothing was salvaged and where
    the old file is, exit 1; the new empty history works."""
    path = history_path(env)
    fill_history(path)
    with open(path, "r+b") as f:
        f.write(b"\xff" * 16)
    before = path.read_bytes()
    repair = fake(env, "history", "repair")
    err = one_error_line(repair)
    assert repair.returncode == 1 and repair.stdout == b""
    assert f"nothing could be salvaged from {path}: its tables cannot be read" in err
    aside = [p for p in path.parent.glob("history.db.corrupt-*")
             if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == before and str(aside[0]) in err
    assert fake(env, "history", "check").stdout.decode().strip() == f"{path}: ok"
