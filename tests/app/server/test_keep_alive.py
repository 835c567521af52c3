"""``ask --keep-alive`` and ``serve --keep-alive``: the first ``ask`` starts a server for the
model and answers through it exactly as an in-process engine does; the next ``ask`` finds that
server (no second one, its prefix cache reused); the server stops by itself once idle for the
duration and removes its state file; bad durations are usage errors (one line, exit 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localchat.app.keep_alive import parse_duration, show_duration
from localchat.app.settings import SettingError, load_settings

QUESTION = "What is the capital of France?"
ASK = ["ask", "--temperature", "0", "--max-tokens", "8", "--no-save", "--json"]


def _run(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", *args], check=False,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def _servers_of(env: dict) -> list[int]:
    """Pids of the ``localchat serve`` processes running with ``env``'s LOCALCHAT_HOME."""
    home = f"LOCALCHAT_HOME={env['LOCALCHAT_HOME']}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"localchat.app.cli\0serve" in cmdline and home in environ.split(b"\0") \
                and _alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def _stop_servers(env: dict) -> None:
    for pid in _servers_of(env):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited server whose parent, init here, has not reaped it
    yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" not in status


@pytest.mark.parametrize(("text", "seconds"), [
    ("300", 300.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), (" 2M ", 120.0),
    ("0", 0.0), ("1", 1.0), ("1.5s", 1.5), ("168h", 604800.0),
])
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "-1", "1e3", "5 minutes", "169h", "1:00",
                                  "0.5", ".01s"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="duration|7 days|1 s"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "shown"), [(300.0, "5m"), (90.0, "90s"), (5400.0, "90m"),
                                                (7.5, "7.5s"), (3600.0, "1h")])
def test_durations_show_in_their_unit(seconds, shown):
    assert show_duration(seconds) == shown
    assert parse_duration(shown) == seconds


def test_the_setting_is_checked_when_read(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('keep_alive = "5m"\n')
    assert load_settings(config, environ={}).keep_alive == "5m"
    config.write_text('keep_alive = 300\n')  # a TOML number: seconds
    assert parse_duration(load_settings(config, environ={}).keep_alive) == 300.0
    config.write_text('keep_alive = 1e9\n')
    with pytest.raises(SettingError, match="longer than 7 days"):
        load_settings(config, environ={})
    config.write_text('keep_alive = true\n')
    with pytest.raises(SettingError, match="keep_alive must be a duration"):
        load_settings(config, environ={})
    config.write_text('keep_alive = "5m"\n')
    with pytest.raises(SettingError, match="LOCALCHAT_KEEP_ALIVE.*not a duration"):
        load_settings(config, environ={"LOCALCHAT_KEEP_ALIVE": "soon"})


@pytest.mark.parametrize("argv", [["ask", "--keep-alive", "5x", "hi"],
                                  ["serve", "--keep-alive", "0"],
                                  ["serve", "--keep-alive", "forever"]])
def test_bad_keep_alive_flags_are_usage_errors(env, argv):
    result = _run(env, *argv, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--keep-alive" in lines[0], result.stderr
    assert not (Path(env["LOCALCHAT_HOME"]) / "run" / "server.json").exists()


def test_ask_starts_a_server_that_the_next_ask_reuses_and_that_stops_when_idle(env):
    state_file = Path(env["LOCALCHAT_HOME"]) / "run" / "server.json"
    local = _run(env, *ASK, "--local", QUESTION)
    assert local.returncode == 0, local.stderr
    pid = None
    try:
        first = _run(env, *ASK, "--keep-alive", "8s", QUESTION)
        assert first.returncode == 0, first.stderr
        pid = json.loads(state_file.read_text())["pid"]
        assert _servers_of(env) == [pid]
        # a fresh server prefills the whole prompt, as the in-process engine does
        assert json.loads(first.stdout)["content"] == json.loads(local.stdout)["content"]
        assert json.loads(first.stdout)["usage"]["cached_tokens"] == 0

        second = _run(env, *ASK, "--keep-alive", "8s", QUESTION, timeout=60)
        assert second.returncode == 0, second.stderr
        assert json.loads(state_file.read_text())["pid"] == pid  # no second server
        assert _servers_of(env) == [pid]
        usage = json.loads(second.stdout)["usage"]
        assert usage["cached_tokens"] > 0  # the warm server's prefix cache answered
        assert usage["prompt_tokens"] == json.loads(first.stdout)["usage"]["prompt_tokens"]

        deadline = time.monotonic() + 60  # 8 s idle, then it stops by itself
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid)
        assert not state_file.exists()
        log = (state_file.parent / "serve.log").read_text()
        assert "no request for 8s (--keep-alive); stopping" in log
        assert "Traceback" not in log
    finally:
        _stop_servers(env)


def test_two_asks_at_once_share_one_server(env):
    """The second ask waits for the server the first one starts (a lock), not a second."""
    try:
        cmd = [sys.executable, "-m", "localchat.app.cli", *ASK, "--keep-alive", "30s"]
        procs = [subprocess.Popen([*cmd, q], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for q in (QUESTION, "What is the capital of Spain?")]
        outs = [p.communicate(timeout=240) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
        state = Path(env["LOCALCHAT_HOME"]) / "run" / "server.json"
        assert _servers_of(env) == [json.loads(state.read_text())["pid"]]
    finally:
        _stop_servers(env)


def test_a_refused_prompt_stops_the_server_it_started(env):
    """The server loads while ask checks the prompt; a prompt no context holds stops it."""
    try:
        result = _run(env, *ASK, "--keep-alive", "60s", "--max-tokens", "5",
                      "word " * 20000)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "localchat: error:" in result.stderr
        deadline = time.monotonic() + 30
        while _servers_of(env) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _servers_of(env) == []
    finally:
        _stop_servers(env)


def test_another_models_server_is_left_alone_with_a_note(monkeypatch, capsys):
    from localchat.app import keep_alive
    from localchat.app.server import state

    other = state.ServerInfo(url="http://127.0.0.1:9", model="qwen2.5-coder-0.5b", pid=4242)
    monkeypatch.setattr(state, "find_server", lambda model=None, timeout=0.5:
                        other if model is None else None)
    monkeypatch.setattr(keep_alive.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    checked = []
    assert keep_alive.kept_alive_server("smollm2-135m", 60.0, lambda: checked.append(1)) is None
    assert checked == [1]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "qwen2.5-coder-0.5b server (pid 4242)" in err


def test_engine_flags_answer_in_process_without_a_server(env):
    result = _run(env, *ASK, "--keep-alive", "30s", "--context", "1024", QUESTION)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["content"]
    assert "note: --keep-alive is not used with --context" in result.stderr
    assert not (Path(env["LOCALCHAT_HOME"]) / "run" / "server.json").exists()
    assert not (Path(env["LOCALCHAT_HOME"]) / "run" / "serve.log").exists()


def test_an_idle_server_unregisters_first_and_serves_a_late_client(env):
    """At the limit the server removes its state file, then stops IDLE_GRACE_S later only if
    no request came: a client that found it just before is answered, and it registers
    again."""
    import httpx

    from tests.app.server.live import start_serve

    serve, state_file, url = start_serve(env, "--keep-alive", "1s")
    try:
        deadline = time.monotonic() + 30
        while state_file.exists():  # idle for 1 s: unregistered, still listening
            assert time.monotonic() < deadline
            time.sleep(0.02)
        reply = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "temperature": 0, "max_tokens": 4,
            "messages": [{"role": "user", "content": QUESTION}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        deadline = time.monotonic() + 30
        while not state_file.exists():  # registered again once the grace period ends
            assert serve.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert serve.wait(60) == 0  # and idle again: it stops by itself
        assert not state_file.exists()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
