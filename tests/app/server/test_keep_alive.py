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
    ("0", 0.0), (".5s", 0.5), ("168h", 604800.0),
])
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "-1", "1e3", "5 minutes", "169h", "1:00"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="duration|7 days"):
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
        assert _alive(pid)
        # a fresh server prefills the whole prompt, as the in-process engine does
        assert json.loads(first.stdout)["content"] == json.loads(local.stdout)["content"]
        assert json.loads(first.stdout)["usage"]["cached_tokens"] == 0

        second = _run(env, *ASK, "--keep-alive", "8s", QUESTION, timeout=60)
        assert second.returncode == 0, second.stderr
        assert json.loads(state_file.read_text())["pid"] == pid  # no second server
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
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_engine_flags_answer_in_process_without_a_server(env):
    result = _run(env, *ASK, "--keep-alive", "30s", "--context", "1024", QUESTION)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["content"]
    assert not (Path(env["LOCALCHAT_HOME"]) / "run" / "server.json").exists()
    assert not (Path(env["LOCALCHAT_HOME"]) / "run" / "serve.log").exists()
