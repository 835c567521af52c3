"""The state file a running ``localchat serve`` leaves in the runtime folder, and finding it.

``<runtime>/server.json`` (``$LOCALCHAT_HOME/run`` when set, else the platform's user runtime
folder): ``{"pid", "url", "model", "aliases", "auth", "started"}``, written atomically with
mode 0600 once the server listens and removed when it stops. It never holds the API key.
``find_server(model)`` reads it and checks the server with ``GET /health`` (a short timeout),
so ``ask`` and the TUI use a warm server only when it is really up and serves that model.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_NAME = "server.json"
HEALTH_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class ServerInfo:
    """A running server: its base ``url`` (``http://host:port``), the model it serves and
    the names it answers to, whether it needs a key, its process id."""

    url: str
    model: str
    aliases: tuple[str, ...] = ()
    auth: bool = False
    pid: int | None = None

    def serves(self, spec: str | None) -> bool:
        """Whether this server answers for ``spec`` (None: any model). A spec naming an
        existing local file or folder matches by its absolute path (a server registers its
        weights' path), so ``./m.gguf`` typed in another folder, or naming another file by
        now, does not match what the server was started with; a path-like spec that names
        nothing matches no server (the in-process load then says it is missing)."""
        if spec is None:
            return True
        local = Path(spec).expanduser()
        if local.exists():
            return str(local.resolve()) in (self.model, *self.aliases)
        if spec.startswith((".", "~", os.sep)) or spec.lower().endswith(".gguf"):
            return False
        return spec == self.model or spec in self.aliases


def runtime_dir() -> Path:
    """Folder for the state file (created, mode 0700): ``$LOCALCHAT_HOME/run`` or the
    platform's user runtime folder, else ``<data>/run`` when that cannot be created."""
    from localchat.app.settings import HOME_ENV, data_dir

    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / "run"
    else:
        import warnings

        import platformdirs

        with warnings.catch_warnings():  # "XDG_RUNTIME_DIR is not set": the fallback is fine
            warnings.simplefilter("ignore")
            path = Path(platformdirs.user_runtime_dir("localchat"))
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        path = data_dir() / "run"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def state_path() -> Path:
    return runtime_dir() / STATE_NAME


def write_state(info: ServerInfo) -> Path:
    """Write ``info`` atomically (0600); returns the file's path."""
    path = state_path()
    doc = {"pid": info.pid if info.pid is not None else os.getpid(), "url": info.url,
           "model": info.model, "aliases": list(info.aliases), "auth": info.auth,
           "started": time.time()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".server-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_state(pid: int | None = None) -> None:
    """Remove the state file if it is this process's (or ``pid``'s)."""
    path = state_path()
    info = read_state()
    if info is not None and info.pid == (pid if pid is not None else os.getpid()):
        with contextlib.suppress(OSError):
            path.unlink()


def read_state() -> ServerInfo | None:
    """The state file's server, or None (missing or unreadable file)."""
    try:
        doc: Any = json.loads(state_path().read_text())
        return ServerInfo(url=str(doc["url"]), model=str(doc["model"]),
                          aliases=tuple(str(a) for a in doc.get("aliases", ())),
                          auth=bool(doc.get("auth", False)), pid=int(doc["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_server(model: str | None = None, timeout: float = HEALTH_TIMEOUT_S
                ) -> ServerInfo | None:
    """The running local server for ``model`` (None: any), checked with ``/health``.

    Returns None when no state file exists, its process is gone, ``/health`` does not answer
    ``ok`` within ``timeout`` seconds, or the server serves another model.
    """
    info = read_state()
    if info is None or not info.serves(model):
        return None
    if info.pid is not None and not _alive(info.pid):
        return None
    from localchat.app.server.transport import StdlibTransport, TransportError

    try:  # http.client, not httpx: this runs in every warm ``ask`` (``transport.py``)
        response = StdlibTransport({}, timeout, timeout).get(info.url + "/health")
        doc = response.json()
    except (TransportError, ValueError):
        return None
    if response.status_code != 200 or not isinstance(doc, dict) or doc.get("status") != "ok":
        return None
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
