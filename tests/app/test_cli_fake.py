"""The real ``localchat`` entry point in subprocesses, on a fake engine (``fake_cli.py``):
redirected output, stdin rules, Ctrl+C (saved and interrupted; a second one while loading),
``-c`` across processes, and the ``history`` commands. stdout and stderr are checked apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localchat.app.store import Store

FAKE_CLI = Path(__file__).with_name("fake_cli.py")
MARKDOWN = "# Title\n\n**bold** and `code`\n\n```python\nprint('x')\n```\n"


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("LOCALCHAT_", "FAKE_")) and k not in ("NO_COLOR", "FORCE_COLOR")}
    e.update(LOCALCHAT_HOME=str(tmp_path / "home"), FAKE_LOG=str(tmp_path / "log.json"),
             TERM="xterm-256color")
    return e


def fake(env, *args, stdin: bytes | None = None, **extra):
    return subprocess.run([sys.executable, str(FAKE_CLI), *args], input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None,
                          capture_output=True, env={**env, **extra}, timeout=120, check=False)


def seen_prompt(env) -> str:
    return json.loads(Path(env["FAKE_LOG"]).read_text())["prompt"]


def db(env) -> Store:
    return Store(Path(env["LOCALCHAT_HOME"]) / "data" / "history.db")


def test_redirected_stdout_has_no_escape_byte(env, tmp_path):
    target = tmp_path / "answer.md"
    with open(target, "wb") as f:
        proc = subprocess.run([sys.executable, str(FAKE_CLI), "ask", "hi"], stdout=f,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              env={**env, "FAKE_REPLY": MARKDOWN, "FORCE_COLOR": ""},
                              timeout=120, check=False)
    assert proc.returncode == 0 and proc.stderr == b""
    assert target.read_bytes() == MARKDOWN.rstrip("\n").encode() + b"\n"
    assert b"\x1b" not in target.read_bytes()


def test_piped_stdin_with_and_without_an_argument(env):
    proc = fake(env, "ask", stdin=b"only stdin\n\n")
    assert proc.returncode == 0 and proc.stdout == b"Hello world\n" and proc.stderr == b""
    assert seen_prompt(env) == "user:only stdin|assistant:"
    proc = fake(env, "ask", "the question", stdin=b"the context\n")
    assert proc.returncode == 0
    assert seen_prompt(env) == "user:the context\n\nthe question|assistant:"
    proc = fake(env, "ask", "just this", "--no-stdin", stdin=b"ignored\n")
    assert seen_prompt(env) == "user:just this|assistant:"
    proc = fake(env, "ask", stdin=b"")
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().startswith("localchat: error: no prompt")


def test_continue_across_processes_and_history_commands(env):
    assert fake(env, "ask", "Name a dragon", FAKE_REPLY="Smaug the golden").returncode == 0
    proc = fake(env, "ask", "-c", "Is it old?", FAKE_REPLY="Very old.")
    assert proc.returncode == 0 and proc.stdout == b"Very old.\n"
    assert seen_prompt(env) == ("user:Name a dragon|assistant:Smaug the golden|"
                                "user:Is it old?|assistant:")
    fake(env, "ask", "Another topic", FAKE_REPLY="Sure.")
    with db(env) as store:
        dragon, other = store.list_conversations()[1].id, store.list_conversations()[0].id

    proc = fake(env, "history", "list")
    assert proc.returncode == 0 and proc.stderr == b"" and b"\x1b" not in proc.stdout
    rows = proc.stdout.decode().splitlines()
    assert rows[0].split() == ["ID", "UPDATED", "MSGS", "MODEL", "TITLE"]
    assert rows[1].startswith(other) and rows[1].endswith("Another topic")
    assert rows[2].startswith(dragon) and " 4 " in rows[2] and rows[2].endswith("Name a dragon")

    proc = fake(env, "history", "search", "golden")  # a word from a past reply
    assert proc.returncode == 0 and proc.stdout.decode() == f"{dragon}  assistant  Smaug the golden\n"
    proc = fake(env, "history", "search", "nothing-like-this")
    assert proc.returncode == 0 and proc.stdout == b"" and b"no message matches" in proc.stderr

    proc = fake(env, "history", "show", dragon[:6])
    text = proc.stdout.decode()
    assert proc.returncode == 0 and text.startswith("# Name a dragon\n")
    assert "## User\n\nIs it old?\n" in text and "## Assistant\n\nVery old.\n" in text
    proc = fake(env, "history", "export", dragon, "--format", "json")
    data = json.loads(proc.stdout)
    assert [m["content"] for m in data["messages"]] == [
        "Name a dragon", "Smaug the golden", "Is it old?", "Very old."]
    proc = fake(env, "history", "export", dragon, "--format", "xml")
    assert proc.returncode == 2 and b"--format must be md or json" in proc.stderr

    proc = fake(env, "history", "rm", dragon)
    assert proc.returncode == 0 and proc.stdout == b""
    assert proc.stderr.decode() == f"localchat: note: deleted conversation {dragon}\n"
    proc = fake(env, "history", "show", dragon)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode().startswith(f"localchat: error: no conversation '{dragon}'")
    assert proc.stderr.count(b"\n") == 1
    proc = fake(env, "history", "show", dragon, "--debug")
    assert proc.returncode == 1 and b"Traceback" in proc.stderr


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129)])
def test_stop_signal_during_generation_saves_the_partial_reply_as_interrupted(env, sig, code):
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_CLI), "ask", "Tell a long story"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        env={**env, "FAKE_REPLY": "Once upon a time " * 50, "FAKE_DELAY": "0.05"})
    first = proc.stdout.read(8)  # the answer is streaming
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=60)
    out = (first + rest).decode()
    assert proc.returncode == code, err.decode()
    assert out.endswith("\n") and len(out) < len("Once upon a time " * 50)
    with db(env) as store:
        conv = store.most_recent()
        msgs = conv.messages
    what = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
    assert err.decode() == (f"localchat: {what}; the reply so far is saved in conversation "
                            f"{conv.id}\n")
    assert [(m.role, m.interrupted) for m in msgs] == [("user", False), ("assistant", True)]
    assert msgs[0].content == "Tell a long story"
    assert msgs[1].content == out[:-1]  # what was printed is what was saved


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129)])
def test_stop_signal_while_loading_keeps_the_message(env, sig, code):
    """Ctrl+C, SIGTERM or SIGHUP while the model loads: exit 128 + the signal, one stderr line
    naming it, and the message saved with an empty reply marked interrupted."""
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_CLI), "ask", "keep me"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**env, "FAKE_LOAD_SECONDS": "2"})
    assert proc.stderr.readline() == b"loading\n"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (code, b""), err.decode()
    with db(env) as store:
        conv = store.most_recent()
        assert [(m.role, m.content, m.interrupted) for m in conv.messages] == [
            ("user", "keep me", False), ("assistant", "", True)]
    what = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
    assert err.decode() == (f"cleaning up\nlocalchat: {what}; your message is saved in "
                            f"conversation {conv.id}\n")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_stop_signal_while_exiting_after_the_reply_is_one_line(env):
    """SIGTERM after the reply was printed and saved, while the process exits (the weight
    cache's background write): one line saying so and exit 143, not a silent death; the reply
    stays complete and not interrupted."""
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_CLI), "ask", "hi"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**env, "FAKE_REPLY": "Hello there", "FAKE_EXIT_SECONDS": "60"})
    assert proc.stderr.readline() == b"exiting\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (143, b"Hello there\n"), err.decode()
    assert err.decode() == ("localchat: stopped by SIGTERM; the command had finished, and the "
                            "process was exiting\n")
    with db(env) as store:
        msgs = store.most_recent().messages
    assert [(m.role, m.content, m.interrupted) for m in msgs] == [
        ("user", "hi", False), ("assistant", "Hello there", False)]


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_second_ctrl_c_while_loading_exits_at_once(env):
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_CLI), "ask", "hi"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**env, "FAKE_LOAD_SECONDS": "60"})
    assert proc.stderr.readline() == b"loading\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stderr.readline() == b"cleaning up\n"  # the first Ctrl+C: a slow clean-up
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    assert time.monotonic() - start < 10  # not the 60 s clean-up
    assert code in (130, -signal.SIGINT) and proc.stdout.read() == b""
    with db(env) as store:
        assert store.list_conversations() == []  # nothing was asked yet


def test_history_stores_a_local_model_as_its_absolute_path(env, tmp_path):
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "x.gguf").write_bytes(b"GGUF")
    proc = subprocess.run([sys.executable, str(FAKE_CLI), "ask", "-m", "./models/x.gguf", "hi"],
                          cwd=work, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert fake(env, "ask", "-m", "smollm2-135m", "hi").returncode == 0
    with db(env) as store:
        convs = store.list_conversations()
    models = [c.model for c in convs]
    assert models == ["smollm2-135m", str((work / "models" / "x.gguf").resolve())]
    proc = fake(env, "ask", "--conversation", convs[1].id, "again")
    assert proc.returncode == 0  # from another folder, -c loads the same file
    assert json.loads(Path(env["FAKE_LOG"]).read_text())["options"]["model"] == models[1]


def test_two_concurrent_continues_store_each_reply_after_its_own_message(env, tmp_path):
    assert fake(env, "ask", "Start", FAKE_REPLY="Started.").returncode == 0
    go = tmp_path / "go"
    slow = subprocess.Popen([sys.executable, str(FAKE_CLI), "ask", "-c", "Question A"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**env, "FAKE_REPLY": "Answer A", "FAKE_WAIT_FILE": str(go)})
    try:
        for _ in range(3000):  # until A's question is committed (A then waits for `go`)
            with db(env) as store:
                if store.most_recent().message_count == 3:
                    break
            time.sleep(0.02)
        fast = fake(env, "ask", "-c", "Question B", FAKE_REPLY="Answer B")
        assert fast.returncode == 0, fast.stderr
    finally:
        go.touch()
        out, err = slow.communicate(timeout=60)
    assert slow.returncode == 0 and out == b"Answer A\n", err
    with db(env) as store:
        msgs = store.most_recent().messages
    assert [m.content for m in msgs] == ["Start", "Started.", "Question A", "Answer A",
                                         "Question B", "Answer B"]
    assert msgs[3].parent_id == msgs[2].id and msgs[5].parent_id == msgs[4].id
    assert fake(env, "ask", "-c", "Next").returncode == 0
    assert seen_prompt(env) == ("user:Start|assistant:Started.|user:Question A|assistant:"
                                "Answer A|user:Question B|assistant:Answer B|user:Next|assistant:")
    shown = fake(env, "history", "show", msgs[0].conversation_id).stdout.decode()
    assert shown.index("Answer A") < shown.index("Question B") < shown.index("Answer B")
