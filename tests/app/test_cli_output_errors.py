"""stdout that goes away or refuses text: ``localchat models | head -1`` ends quietly with 141
as ``ask | head`` does (typer's own answer was exit 1), and a full disk behind stdout
(``ask > /dev/full``) gives one line naming it, exit 1, with the reply kept in the history,
instead of an ``internal error``."""

from __future__ import annotations

import errno
import io
import subprocess
import sys
from pathlib import Path

import pytest

from localchat.app import ask_cmd, cli, cli_io, output_errors

from .fake_engine import FakeEngine
from .test_cli import env  # noqa: F401 - the subprocess fixture


class _Stdout(io.TextIOBase):
    """``sys.stdout`` whose writes fail with ``exc`` once ``room`` characters are taken (no
    file descriptor: ``silence_stdout`` leaves the test's own stdout alone)."""

    def __init__(self, room: int, exc: OSError) -> None:
        self.room, self.exc, self.text = room, exc, ""

    def write(self, s: str) -> int:
        if len(self.text) + len(s) > self.room:
            raise self.exc
        self.text += s
        return len(s)

    def isatty(self) -> bool:
        return False


def _full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def run_with_stdout(monkeypatch, capsys, tmp_path):
    """Run ``localchat ARGS`` in-process (``ask`` on a FakeEngine) with ``sys.stdout`` set to
    ``stdout``; returns (exit code, stderr)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))

    def go(args, stdout, deltas=("Hello", " world", "!")):
        monkeypatch.setattr(ask_cmd, "load_engine", lambda options: FakeEngine(list(deltas)))
        monkeypatch.setattr(sys, "stdin", None)
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdout", stdout)
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), args)
        return code, capsys.readouterr().err

    return go


def _last_messages(home: Path):
    from localchat.app.store import Store

    with Store(home / "data" / "history.db") as store:
        return store.most_recent().messages


def test_a_full_disk_while_streaming_says_so_and_keeps_the_reply(run_with_stdout, tmp_path):
    out = _Stdout(5, _full())
    code, err = run_with_stdout(["ask", "hi"], out)
    assert code == 1 and out.text == "Hello", err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("localchat: error: cannot write to standard output: No space "
                               "left on device; the reply so far is saved in conversation ")
    msgs = _last_messages(tmp_path / "home")
    assert [(m.role, m.content, m.interrupted) for m in msgs] == [
        ("user", "hi", False), ("assistant", "Hello world", True)]  # generated so far


@pytest.mark.parametrize("flag", ["--no-stream", "--json"])
def test_a_full_disk_at_the_end_says_the_whole_reply_is_saved(run_with_stdout, tmp_path, flag):
    code, err = run_with_stdout(["ask", flag, "hi"], _Stdout(0, _full()))
    assert code == 1
    said = ("localchat: error: cannot write to standard output: No space left on device; the "
            f"reply is saved in conversation {_conversation_id(tmp_path / 'home')}")
    assert err.strip().splitlines() == [said]
    msgs = _last_messages(tmp_path / "home")
    assert [(m.content, m.interrupted) for m in msgs] == [("hi", False), ("Hello world!", False)]


def _conversation_id(home: Path) -> str:
    from localchat.app.store import Store

    with Store(home / "data" / "history.db") as store:
        return store.most_recent().id


def test_a_full_disk_under_a_listing_is_one_line_not_an_internal_error(run_with_stdout):
    code, err = run_with_stdout(["models"], _Stdout(10, _full()))
    assert code == 1
    assert err == "localchat: error: cannot write to standard output: No space left on device\n"


def test_other_os_errors_stay_internal_errors():
    """Only a medium's errno without a file name is taken for stdout's."""
    assert output_errors.output_error(OSError(errno.ENOSPC, "full", "/some/file")) is None
    assert output_errors.output_error(OSError(errno.EACCES, "denied")) is None
    assert output_errors.output_error(ValueError("x")) is None
    assert output_errors.output_error(OSError(errno.EIO, "Input/output error")) == (
        "cannot write to standard output: Input/output error")


def test_a_closed_pipe_under_a_listing_exits_141_quietly_in_process(run_with_stdout):
    code, err = run_with_stdout(["models"], _Stdout(10, BrokenPipeError(errno.EPIPE, "pipe")))
    assert (code, err) == (141, "")


def test_models_into_a_closed_pipe_exits_141_quietly(env):  # noqa: F811
    """The real entry point with its stdout's reader gone before it writes (what ``| head -1``
    does to the lines after the first)."""
    proc = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "models"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=120), err) == (141, "")


def test_ctrl_c_in_a_jsonl_turn_writes_its_line_then_exits_130(monkeypatch, capsys, tmp_path):
    """The reply so far reaches the script reading the lines, marked interrupted; later input
    lines are not read."""
    import json

    from localchat.app import chat_jsonl

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    engine = FakeEngine(["Hel", "lo", " there"], interrupt_after=2)
    monkeypatch.setattr(chat_jsonl, "load_engine", lambda options: engine, raising=False)
    monkeypatch.setattr(ask_cmd, "load_engine", lambda options: engine)
    stdin = io.StringIO(json.dumps({"role": "user", "content": "hi"}) + "\n"
                        + json.dumps({"role": "user", "content": "never read"}) + "\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["chat", "--jsonl"])
    out, err = capsys.readouterr()
    assert (code, err) == (130, "localchat: interrupted\n")
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert (line["content"], line["finish_reason"]) == ("Hello", "interrupted")
    assert line["usage"]["completion_tokens"] == 2


def test_a_closed_stdout_is_one_line_not_a_crash_or_silence(env):  # noqa: F811
    """``localchat models >&-``: Python leaves ``sys.stdout`` None; a listing printed nowhere
    and exited 0, ``ask`` crashed on None (internal error)."""
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "models"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env, timeout=120, check=False,
                          preexec_fn=lambda: __import__("os").close(1))
    assert (proc.returncode, proc.stderr.decode()) == (
        1, "localchat: error: cannot write to standard output: it is closed\n")


def test_ask_into_a_closed_stdout_keeps_the_reply(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ask_cmd, "load_engine", lambda options: FakeEngine(["Hel", "lo"]))
    monkeypatch.setattr(sys, "stdin", None)
    monkeypatch.setattr(sys, "stdout", None)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("localchat: error: cannot write to standard output: it is closed; "
                          "the reply so far is saved in conversation "), err
    msgs = _last_messages(tmp_path / "home")
    assert [(m.content, m.interrupted) for m in msgs] == [("hi", False), ("Hel", True)]


def test_sigterm_in_a_jsonl_turn_writes_its_line_then_exits_143(env, tmp_path):  # noqa: F811
    """A real SIGTERM to ``chat --jsonl`` (the fake engine of ``fake_cli.py`` streams slowly):
    the turn's line with the reply so far, ``stopped by SIGTERM``, 143 (it was killed by the
    signal with nothing written)."""
    import json
    import signal
    import time

    from .test_cli_fake import FAKE_CLI

    proc = subprocess.Popen([sys.executable, str(FAKE_CLI), "chat", "--jsonl"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**env, "FAKE_REPLY": "word " * 400, "FAKE_DELAY": "0.02",
                                 "FAKE_LOG": str(tmp_path / "started")})
    proc.stdin.write(json.dumps({"role": "user", "content": "hi"}).encode() + b"\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the reply has begun
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    (line,) = [json.loads(x) for x in out.decode().splitlines()]
    assert line["finish_reason"] == "interrupted" and line["content"].startswith("word ")
    assert err.decode().endswith("localchat: stopped by SIGTERM\n")
