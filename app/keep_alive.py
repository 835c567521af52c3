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
(that one stays the server clients find; a note says so), bound to 127.0.0.1 on a free port,
in its own session (a Ctrl+C in the terminal does not reach it), its output in
``<runtime>/serve.log``. One ``ask`` at a time starts a server (a lock file beside the state
file): an ``ask`` that comes while another one's server loads waits for it and uses it. The
server loads while ``ask`` checks the prompt against the context; a refused prompt, Ctrl+C,
SIGTERM or SIGHUP stops it again; if it does not come up, ``ask`` says so in one line (the
log's last line) and answers in-process. The duration is the server's, set by the ``ask``
that started it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localchat.app import cli_io

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h)?")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_S = 7 * 24 * 3600.0
MIN_S = 1.0  # shorter keeps nothing: the server could stop between a client's check and request
READY_TIMEOUT_S = 300.0  # the longest wait for the started server to load and listen
POLL_S = 0.1
LOG_NAME = "serve.log"
LOCK_NAME = "keep-alive.lock"


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit ``s``, ``m`` or ``h`` (``300``,
    ``90s``, ``5m``, ``1.5h``), from 1 s to 7 days; ``0`` means "do not keep a server".

    Raises:
        ValueError: not a duration, under 1 s (but 0) or over 7 days; the message says what
            is accepted.
    """
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: give seconds or a number with s, m "
                         "or h (90s, 5m, 1h)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_S:
        raise ValueError(f"{text!r} is longer than 7 days")
    if 0 < seconds < MIN_S:
        raise ValueError(f"{text!r} is shorter than 1 s (0 keeps no server)")
    return seconds


def show_duration(seconds: float) -> str:
    """``seconds`` in the largest whole unit: ``1h``, ``90m``, ``45s``, ``7.5s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def kept_alive_server(model: str, seconds: float, check: Callable[[], None]) -> Any:
    """The ``state.ServerInfo`` of a server for ``model`` kept ``seconds`` after its last
    request, or None to answer in-process; ``check()`` (the prompt check) runs once while a
    server this starts loads, or before returning None, and its exception propagates after
    the started server is stopped. A server another ``ask`` started meanwhile is used
    (``check`` is then the server's). Ctrl+C, SIGTERM or SIGHUP stop a server being started
    (the signal then has its usual effect)."""
    from localchat.app.server.state import find_server

    with _start_lock():
        info = find_server(model)  # one that another ask started while we waited for the lock
        if info is not None and not info.auth:  # (a keyed one ask has no key for: a note below)
            return info
        starting = start_server(model, seconds)
        if starting is None:
            check()
            return None
        with starting.stopped_by_signals():
            try:
                check()
            except BaseException:
                starting.stop()
                raise
            return starting.wait()


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    """Hold ``<runtime>/keep-alive.lock`` (``flock``; blocks while another ``ask`` starts a
    server). Where ``fcntl`` is missing, no lock."""
    from localchat.app.server.state import runtime_dir

    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        yield
        return
    with open(runtime_dir() / LOCK_NAME, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class StartingServer:
    """A ``localchat serve`` this process started (:func:`start_server`), not yet waited for:
    the caller does its own work (the prompt check) while the server loads, then
    :meth:`wait`."""

    def __init__(self, proc: subprocess.Popen, model: str, log: Path) -> None:
        self.proc, self.model, self.log = proc, model, log

    def wait(self) -> Any:
        """The server's ``state.ServerInfo`` once it serves the model, or None after one
        note on stderr: it exited (the note quotes its log's last line) or did not listen
        within :data:`READY_TIMEOUT_S` seconds (it is stopped). Ctrl+C stops it too."""
        from localchat.app.server.state import find_server

        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                info = find_server(self.model)
                if info is not None:
                    if info.pid != self.proc.pid:  # a server started by hand meanwhile
                        self.stop()
                    return info
                time.sleep(POLL_S)
        except BaseException:
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

    @contextlib.contextmanager
    def stopped_by_signals(self) -> Iterator[None]:
        """While the block runs, SIGTERM and SIGHUP stop the server, then act as they would
        have (the default action: the process ends with 128 + the signal). Ctrl+C raises
        ``KeyboardInterrupt`` as usual (the callers stop the server on it). Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            self.stop()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        names = ("SIGTERM", "SIGHUP")
        sigs = [getattr(signal, n) for n in names if hasattr(signal, n)]
        previous = {sig: signal.signal(sig, handler) for sig in sigs}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def start_server(model: str, seconds: float) -> StartingServer | None:
    """Start ``localchat serve -m MODEL --port 0 --keep-alive SECONDS`` detached (no wait:
    :meth:`StartingServer.wait`), or return None to answer in-process: the model is not on
    disk, or another model's live server holds the state file (a note says so)."""
    from localchat.app.server.state import find_server, runtime_dir
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model

    try:
        resolve_model(model, cache_dir=cache_dir(), download=False)
    except LocalchatError:
        return None
    other = find_server(None)
    if other is not None:  # the server clients find serves another model: leave it be
        cli_io.note(f"--keep-alive: the {other.model} server (pid {other.pid}) is the one "
                    f"clients find; answering here")
        return None
    log = runtime_dir() / LOG_NAME
    # a fresh file: a previous server in its idle grace period still writes to the old one
    log.unlink(missing_ok=True)
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
