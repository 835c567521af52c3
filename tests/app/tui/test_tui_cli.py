"""``localchat`` / ``localchat chat`` open the TUI on a terminal (a pty here), and say so in one
line when there is no terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

CLI = [sys.executable, "-m", "localchat.app.cli"]


def env_for(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env.update(LOCALCHAT_HOME=str(home), TERM="xterm-256color", COLUMNS="100", LINES="30",
               HF_HUB_OFFLINE="1")
    return env


def test_chat_without_a_terminal_is_a_usage_error(isolated_home):
    proc = subprocess.run([*CLI, "chat"], check=False, stdin=subprocess.DEVNULL, capture_output=True,
                          env=env_for(isolated_home), timeout=60)
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert lines == [("localchat: error: the chat TUI needs a terminal; use 'localchat chat "
                     "--jsonl' or 'localchat ask'")]


def test_tui_on_a_pty_reports_a_bad_model_and_quits_cleanly(isolated_home):
    main, sub = pty.openpty()
    proc = subprocess.Popen([*CLI, "-m", "./no-such-model.gguf", "--theme", "light"],
                            stdin=sub, stdout=sub, stderr=sub, env=env_for(isolated_home),
                            close_fds=True)
    os.close(sub)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b"no-such-model" not in seen.replace(b"\x1b", b""):
            assert time.monotonic() < deadline, seen[-2000:]
            if select.select([main], [], [], 0.5)[0]:
                try:
                    seen += os.read(main, 65536)
                except OSError:
                    break
        os.write(main, b"\x11")  # Ctrl+Q
        while proc.poll() is None:
            assert time.monotonic() < deadline
            if select.select([main], [], [], 0.2)[0]:
                try:
                    seen += os.read(main, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    assert b"Traceback" not in seen
    # The theme flag applied: the light theme's background (#fafafa) was drawn.
    assert b"250;250;250" in seen or b"48;5;231" in seen


def test_one_bad_keys_entry_keeps_the_valid_bindings_and_names_the_file(make_app):
    from localchat.app.settings import Settings, config_path
    from localchat.app.tui.keymap import PREFIX

    settings = Settings(keys={"stop": "escape", "nosuch": "ctrl+x", "help": " , "})
    app = make_app(settings=settings)
    assert app.keymap == {PREFIX + "stop": "escape"}
    error = app._keymap_error
    assert str(config_path()) in error and "keys.nosuch ignored" in error
    assert "keys.help ignored" in error and "[" not in error.split("known:")[0]
