"""Servers for tests: a uvicorn server on 127.0.0.1 (a free port) in a background thread
(:class:`ServerThread`), and a real ``localchat serve`` subprocess (:func:`start_serve`)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn


class ServerThread:
    """Serve ``app`` on ``127.0.0.1:<free port>`` until :meth:`stop` (bounded waits);
    ``config`` overrides ``uvicorn.Config``'s arguments (quiet, no access log, by default)."""

    def __init__(self, app: Any, **config: Any) -> None:
        from localchat.app.server.serve_cmd import _bind

        self.sock = _bind("127.0.0.1", 0)  # serve's own listening socket (TCP_NODELAY)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        options = {"log_level": "warning", "access_log": False, "lifespan": "off",
                   "timeout_graceful_shutdown": 2, **config}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name="test-uvicorn")

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def start_serve(env: dict, *args: str, stdout: int = subprocess.DEVNULL
                ) -> tuple[subprocess.Popen, Path, str]:
    """``localchat serve --port 0 *args`` in a subprocess (``env``'s ``LOCALCHAT_HOME``),
    returned once it has written its state file: ``(process, state file, url)``. The
    process is killed, and the test failed, when it exits or has not started in 240 s."""
    serve = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "serve", "--port", "0",
                              *args], stdin=subprocess.DEVNULL, stdout=stdout,
                             stderr=subprocess.PIPE, env=env)
    state_file = Path(env["LOCALCHAT_HOME"]) / "run" / "server.json"
    deadline = time.monotonic() + 240
    try:
        while not state_file.exists():
            assert serve.poll() is None, serve.stderr.read().decode()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        return serve, state_file, json.loads(state_file.read_text())["url"]
    except BaseException:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
        raise
