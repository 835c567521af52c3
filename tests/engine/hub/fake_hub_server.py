"""A fake Hugging Face Hub on 127.0.0.1 for download tests (``HF_ENDPOINT=server.url``).

It speaks the small part of the Hub's HTTP API that ``huggingface_hub`` uses to download a
snapshot: ``/api/models/{repo}/revision/{rev}`` (repo info), ``/api/models/{repo}/tree/{rev}``
(file listing with sizes), and ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (file metadata and
bytes, with ``Range`` for resumed downloads). Errors carry the Hub's ``X-Error-Code`` header
(``RepoNotFound``, ``GatedRepo``, ``RevisionNotFound``, ``EntryNotFound``). Every request is
logged in ``server.requests`` as ``(method, path, headers)`` so a test can check which files
were fetched, and ``cut_after`` makes the next GET of a file stop after that many bytes (an
interrupted download).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    """``revisions`` maps a branch or tag to a commit; ``commits`` a commit to its files.
    A ``gated`` repo needs ``Authorization: Bearer <token>``."""

    revisions: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: bool = False
    token: str | None = None

    def add_commit(self, files: dict[str, bytes], *refs: str) -> str:
        commit = hashlib.sha1(json.dumps(sorted(files)).encode() + b"".join(
            files[k] for k in sorted(files))).hexdigest()
        self.commits[commit] = dict(files)
        for ref in refs:
            self.revisions[ref] = commit
        return commit

    def resolve(self, rev: str) -> str | None:
        return self.revisions.get(rev) or (rev if rev in self.commits else None)


class FakeHub:
    """The server: ``with FakeHub() as hub: hub.repos["org/name"] = FakeRepo(...)``."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.cut_after: dict[str, int] = {}  # path -> bytes sent before dropping, once
        self.stall_after: dict[str, int] = {}  # path -> bytes sent before hanging, once
        self.stalled = threading.Event()
        self.release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fetched(self) -> list[str]:
        """Paths of the files whose bytes were requested with GET (``resolve`` URLs)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.requests
                if m == "GET" and "/resolve/" in p]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path,
                                 {k.lower(): v for k, v in self.headers.items()}))
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                for kind in ("revision", "tree"):
                    repo_id, sep, tail = rest.partition(f"/{kind}/")
                    if sep:
                        return self._api(kind, repo_id, tail.strip("/"), body)
                return self._error(404, "RepoNotFound", body)
            repo_id, sep, tail = path.lstrip("/").partition("/resolve/")
            if not sep:
                return self._error(404, "RepoNotFound", body)
            rev, _, file_path = tail.partition("/")
            repo, commit = self._checked(repo_id, rev, body)
            if repo is None:
                return None
            data = repo.commits[commit].get(file_path)
            if data is None:
                return self._error(404, "EntryNotFound", body)
            return self._file(path, commit, data, body)

        def _checked(self, repo_id: str, rev: str, body: bool):
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", body)
                return None, None
            if repo.gated and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(403, "GatedRepo", body)
                return None, None
            commit = repo.resolve(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", body)
                return None, None
            return repo, commit

        def _api(self, kind: str, repo_id: str, rev: str, body: bool) -> None:
            repo, commit = self._checked(repo_id, rev, body)
            if repo is None:
                return
            files = repo.commits[commit]
            if kind == "revision":
                payload = {"id": repo_id, "sha": commit, "private": False, "gated": repo.gated,
                           "siblings": [{"rfilename": p} for p in files]}
            else:
                payload = [{"type": "file", "path": p, "size": len(d),
                            "oid": hashlib.sha1(d).hexdigest()} for p, d in files.items()]
            self._send(200, json.dumps(payload).encode(), body,
                       {"Content-Type": "application/json"})

        def _file(self, path: str, commit: str, data: bytes, body: bool) -> None:
            etag = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first or 0)
                end = int(last) + 1 if last else len(data)
                chunk = data[start:end]
                headers["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
                return self._send(206, chunk, body, headers)
            get = self.command == "GET"
            cut = hub.cut_after.pop(path, None) if get else None
            stall = hub.stall_after.pop(path, None) if get else None
            if cut is not None or stall is not None:  # announce it all, send part, drop
                self.send_response(200)
                for k, v in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data[: cut if cut is not None else stall])
                self.wfile.flush()
                if stall is not None:
                    hub.stalled.set()
                    hub.release.wait(60)
                self.close_connection = True
                return None
            return self._send(200, data, body, headers)

        def _error(self, status: int, code: str, body: bool) -> None:
            self._send(status, json.dumps({"error": code}).encode(), body,
                       {"X-Error-Code": code, "X-Error-Message": code,
                        "Content-Type": "application/json"})

        def _send(self, status: int, data: bytes, body: bool, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(k, v)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
