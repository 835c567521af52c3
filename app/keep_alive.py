"""``ask --keep-alive DURATION``: answer through a ``localchat serve`` started for the purpose,
which keeps the model loaded until it has had no request for DURATION, so the next ``ask`` on
the same model finds it (``server/state.py``) and skips the interpreter's ``import torch``,
the tokenizer, the load and the kernels' first calls. Ollama keeps a model loaded after a
request the same way (its ``keep_alive``, five minutes by default); here it is asked for,
per command (``--keep-alive``) or once (``keep_alive`` in ``config.toml`` /
``LOCALCHAT_KEEP_ALIVE``), because a one-shot command that leaves a process behind would
surprise a llama-cli user.

The server is started only for a model already on disk (a download shows its progress in the
``ask`` that needs it, in-process), only when no other live server holds the state file
(that one stays the server clients find), bound to 127.0.0.1 on a free port, in its own
session (a Ctrl+C in the terminal does not reach it), its output in ``<runtime>/serve.log``.
The server loads while ``ask`` checks the prompt against the context; if it does not come
up, ``ask`` says so in one line (the log's last line) and answers in-process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from localchat.app import cli_io

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h)?")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_S = 7 * 24 * 3600.0
READY_TIMEOUT_S = 300.0  # the longest wait for the started server to load and listen
POLL_S = 0.1
LOG_NAME = "serve.log"


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit ``s``, ``m`` or ``h`` (``300``,
    ``90s``, ``5m``, ``1.5h``), at most 7 days; ``0`` means "do not keep a server".

    Raises:
        ValueError: not a duration or over 7 days; the message says what is accepted.
    """
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: give seconds or a number with s, m "
                         "or h (90s, 5m, 1h)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_S:
        raise ValueError(f"{text!r} is longer than 7 days")
    return seconds


def show_duration(seconds: float) -> str:
    """``seconds`` in the largest whole unit: ``1h``, ``90m``, ``45s``, ``7.5s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


class StartingServer:
    """A ``localchat serve`` this process started (:func:`start_server`), not yet waited for:
    the caller does its own work (the prompt check) while the server loads, then
    :meth:`wait`."""

    def __init__(self, proc: subprocess.Popen, model: str, log: Path) -> None:
        self.proc, self.model, self.log = proc, model, log

    def wait(self) -> object | None:
        """The server's ``state.ServerInfo`` once it serves the model, or None after one
        note on stderr: it exited (the note quotes its log's last line) or did not listen
        within :data:`READY_TIMEOUT_S` seconds (it is stopped). Ctrl+C stops it too."""
        from localchat.app.server.state import find_server

        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                info = find_server(self.model)
                if info is not None:
                    return info
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.stop()
            raise
        if self.proc.poll() is None:
            self.stop()
            why = f"it did not listen within {READY_TIMEOUT_S:g} s"
        else:
            why = _last_line(self.log) or f"it exited with code {self.proc.returncode}"
        cli_io.note(f"--keep-alive: the server did not start ({why}; see {self.log}); "
                    "answering here")
        return None

    def stop(self) -> None:
        """Stop the server (SIGTERM: it removes its state file)."""
        if self.proc.poll() is None:
            self.proc.terminate()


def start_server(model: str, seconds: float) -> StartingServer | None:
    """Start ``localchat serve -m MODEL --port 0 --keep-alive SECONDS`` detached (no wait:
    :meth:`StartingServer.wait`), or return None to answer in-process: the model is not on
    disk, or another live server holds the state file."""
    from localchat.app.server.state import find_server, read_state, runtime_dir
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model

    try:
        resolve_model(model, cache_dir=cache_dir(), download=False)
    except LocalchatError:
        return None
    if read_state() is not None and find_server(None) is not None:
        return None  # another model's server is the one clients find: leave it be
    log = runtime_dir() / LOG_NAME
    cmd = [sys.executable, "-m", "localchat.app.cli", "serve", "-m", model, "--port", "0",
           "--keep-alive", f"{seconds:g}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    cli_io.notice(f"starting a server for {model} (pid {proc.pid}), kept loaded "
                  f"{show_duration(seconds)} after its last request ...")
    return StartingServer(proc, model, log)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")
