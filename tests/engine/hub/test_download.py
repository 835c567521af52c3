"""``localchat pull REPO[@REV]`` against a fake Hub on 127.0.0.1 (``HF_ENDPOINT``).

The real ``huggingface_hub`` client runs in a ``localchat`` subprocess with ``HF_HOME`` in a
temporary folder; the fake server (``fake_hub_server.py``) logs every request, so the tests see
which files were fetched, at which revision, and with which ``Range``. Paths huggingface_hub
cannot be made to take over HTTP (a full disk) are tested at its boundary with monkeypatch. No
test touches the real network.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.file_download import DryRunFileInfo

from localchat.engine.errors import ModelDownloadError
from localchat.engine.hub import download
from localchat.engine.hub.download import hub_snapshot
from tests.engine.hub.fake_hub_server import FakeHub, FakeRepo

WEIGHTS = os.urandom(1_500_000)
WANTED = {
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b'{"do_sample": true}',  # distinct contents: distinct blobs
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b'{"model_max_length": 8192}',
    "special_tokens_map.json": b'{"eos_token": "</s>"}',
    "chat_template.jinja": b"{{ messages }}",
    "model.safetensors": WEIGHTS,
}
UNWANTED = {
    "pytorch_model.bin": b"pickle", "model.pt": b"pickle", "original/consolidated.00.pth": b"p",
    "model.onnx": b"onnx", "onnx/model.onnx": b"onnx", "consolidated.safetensors": b"dup",
    "README.md": b"# hi", "modeling_custom.py": b"import os",
}  # fmt: skip
SECRET = "hf_fakeTOKENthatMustNeverShow123"


@pytest.fixture
def hub():
    with FakeHub() as server:
        repo = FakeRepo()
        repo.add_commit({**WANTED, **UNWANTED}, "main")
        repo.add_commit({"config.json": b'{"revision": "v1"}', "model.safetensors": b"v1"}, "v1")
        server.repos["org/tiny"] = repo
        server.repos["org/gated"] = FakeRepo(gated=True, token=SECRET)
        server.repos["org/gated"].add_commit(dict(WANTED), "main")
        yield server


@pytest.fixture
def env(tmp_path, hub):
    """Environment of a ``localchat`` subprocess: fake endpoint, empty caches, no token."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE")}
    e.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
             LOCALCHAT_HOME=str(tmp_path / "lc"), HF_HUB_ETAG_TIMEOUT="5")
    return e


def pull(env, spec, **extra):
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", "pull", spec],
                          env={**env, **extra}, capture_output=True, text=True, timeout=120,
                          check=False)


def error_line(proc) -> str:
    """The one ``localchat: error:`` line of a failed run (exit 1, no traceback)."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("localchat: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def snapshot_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


def test_pull_fetches_only_the_needed_files_with_progress(env, hub):
    proc = pull(env, "org/tiny")
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip())
    assert folder.is_relative_to(Path(env["HF_HOME"]))
    assert snapshot_files(folder) == WANTED
    assert sorted(hub.fetched()) == sorted(WANTED)  # nothing else was even requested
    assert not any(p.endswith((".bin", ".pt", ".pth", ".onnx")) for _, p, _ in hub.requests)
    # progress: bytes done / total, rate and ETA, on stderr only
    total = sum(len(v) for v in WANTED.values())
    assert f"downloading org/tiny from the Hugging Face Hub: {len(WANTED)} files" in proc.stderr
    last = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if "ETA" in ln][-1]
    assert f"{total / 1e6:.2f}MB / {total / 1e6:.2f}MB (100%)" in last


def test_revision_pinning(env, hub):
    v1 = pull(env, "org/tiny@v1")
    assert v1.returncode == 0, v1.stderr
    commit = hub.repos["org/tiny"].revisions["v1"]
    folder = Path(v1.stdout.strip())
    assert folder.name == commit
    assert (folder / "config.json").read_bytes() == b'{"revision": "v1"}'
    assert any(p == "/api/models/org/tiny/revision/v1" for _, p, _ in hub.requests)
    main = pull(env, "org/tiny")
    assert Path(main.stdout.strip()).name == hub.repos["org/tiny"].revisions["main"]
    by_hash = pull(env, f"org/tiny@{commit}", HF_HUB_OFFLINE="1")  # a commit needs no lookup
    assert by_hash.returncode == 0 and Path(by_hash.stdout.strip()) == folder


def test_offline_uses_the_cache_and_fails_clearly_without_it(env, hub):
    first = pull(env, "org/tiny")
    hub.requests.clear()
    again = pull(env, "org/tiny", HF_HUB_OFFLINE="1")
    assert (again.returncode, again.stdout) == (0, first.stdout)
    assert hub.requests == []
    line = error_line(pull(env, "org/tiny@v1", HF_HUB_OFFLINE="1"))
    assert "org/tiny@v1 is not in the local Hugging Face cache" in line
    assert "HF_HUB_OFFLINE" in line and hub.requests == []


def test_gated_repo_needs_a_token_that_is_never_printed(env, hub):
    line = error_line(pull(env, "org/gated"))
    assert "accept the terms on the model page" in line and "set HF_TOKEN" in line
    wrong = pull(env, "org/gated", HF_TOKEN=SECRET + "x")
    assert "has no access" in error_line(wrong)
    ok = pull(env, "org/gated", HF_TOKEN=SECRET)
    assert ok.returncode == 0, ok.stderr
    assert snapshot_files(Path(ok.stdout.strip())) == WANTED
    for proc in (wrong, ok):
        assert SECRET not in proc.stdout + proc.stderr
    sent = [h.get("authorization") for _, p, h in hub.requests if "gated" in p]
    assert f"Bearer {SECRET}" in sent


def test_missing_repo_and_revision(env, hub):
    assert "no Hugging Face Hub repo org/absent" in error_line(pull(env, "org/absent"))
    assert "org/tiny has no revision 'nope'" in error_line(pull(env, "org/tiny@nope"))


def test_network_unreachable(env):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = error_line(pull(env, "org/tiny", HF_ENDPOINT=f"http://127.0.0.1:{port}"))
    assert "cannot reach the Hugging Face Hub" in line and "org/tiny" in line


def test_dropped_connection_resumes_with_range(env, hub):
    """huggingface_hub writes 10 MiB chunks: a connection dropped after the first one resumes
    from there with an HTTP Range request, and the file ends byte-identical."""
    big = os.urandom(12 * 2**20)
    repo = FakeRepo()
    commit = repo.add_commit({"config.json": b"{}", "model.safetensors": big}, "main")
    hub.repos["org/big"] = repo
    path = f"/org/big/resolve/{commit}/model.safetensors"
    hub.cut_after[path] = 11 * 2**20
    proc = pull(env, "org/big")
    assert proc.returncode == 0, proc.stderr
    assert (Path(proc.stdout.strip()) / "model.safetensors").read_bytes() == big
    ranges = [h.get("range") for m, p, h in hub.requests if m == "GET" and p == path]
    assert ranges[0] is None and len(ranges) == 2
    start = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= 11 * 2**20


def test_killed_download_never_looks_complete_and_pull_finishes_it(env, hub):
    commit = hub.repos["org/tiny"].revisions["main"]
    path = f"/org/tiny/resolve/{commit}/model.safetensors"
    hub.stall_after[path] = 500_000
    proc = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "pull", "org/tiny"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert hub.stalled.wait(60)
    finally:
        proc.kill()
        proc.communicate()
    hub.release.set()
    snap = Path(env["HF_HOME"]) / "hub" / "models--org--tiny" / "snapshots" / commit
    assert not (snap / "model.safetensors").exists()
    kept = set(snapshot_files(snap)) if snap.exists() else set()
    line = error_line(pull(env, "org/tiny", HF_HUB_OFFLINE="1"))
    assert "only partly downloaded" in line
    hub.requests.clear()
    done = pull(env, "org/tiny")
    assert done.returncode == 0, done.stderr
    assert snapshot_files(Path(done.stdout.strip())) == WANTED
    fetched = hub.fetched()  # only what was missing (a blob whose link was pending is reused)
    assert "model.safetensors" in fetched and set(fetched) <= set(WANTED) - kept


def test_ctrl_c_stops_the_download_within_a_chunk(env, hub):
    """Ctrl+C exits 130 without finishing the file in flight (huggingface_hub's thread pool
    would otherwise fetch every queued file before exiting); nothing partial is linked."""
    big = os.urandom(12 * 2**20)
    repo = FakeRepo()
    commit = repo.add_commit({"config.json": b"{}", "model.safetensors": big}, "main")
    hub.repos["org/big"] = repo
    hub.stall_after[f"/org/big/resolve/{commit}/model.safetensors"] = 2**20
    proc = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "pull", "org/big"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert hub.stalled.wait(60)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        hub.release.set()  # the server sends the rest: the worker must not write it
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    snap = Path(env["HF_HOME"]) / "hub" / "models--org--big" / "snapshots" / commit
    assert not (snap / "model.safetensors").exists()
    blobs = Path(env["HF_HOME"]) / "hub" / "models--org--big" / "blobs"
    assert not any(p.name.endswith(".incomplete") for p in blobs.iterdir())


# -- at the huggingface_hub boundary (monkeypatched) ------------------------------------------

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def dry_run_only(monkeypatch, tmp_path):
    """snapshot_download that lists one 5 GB file and must not be asked to download."""
    calls = []

    def fake(repo_id, **kw):
        calls.append(kw)
        if kw.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        if kw.get("dry_run"):
            return [DryRunFileInfo("0" * 40, 5 * 10**9, "model.safetensors", "", False, True),
                    DryRunFileInfo("0" * 40, 10, "config.json", "", True, False)]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "absent"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return calls


def test_free_disk_is_checked_before_downloading(dry_run_only, monkeypatch, tmp_path):
    seen = []

    def usage(path):
        seen.append(Path(path))
        return Usage(10**12, 10**12 - 4 * 10**9, 4 * 10**9)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    with pytest.raises(ModelDownloadError) as err:
        hub_snapshot("org/big", None)
    msg = str(err.value)
    assert "not enough disk space for org/big" in msg and "5.0 GB" in msg and "4.0 GB" in msg
    assert seen == [tmp_path]  # the nearest existing folder of the cache
    assert not any(not c.get("dry_run") and not c.get("local_files_only")
                   for c in dry_run_only)


def test_disk_full_during_download(dry_run_only, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**13, 0, 10**13))
    with pytest.raises(ModelDownloadError) as err:
        hub_snapshot("org/big", "main")
    assert "disk full while downloading org/big@main" in str(err.value)
    assert "localchat pull org/big@main" in str(err.value)


def test_token_is_redacted_from_messages(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    text = download._redact(RuntimeError(f"401 for Authorization: Bearer {SECRET}\nmore"))
    assert SECRET not in text and "***" in text and "\n" not in text


def test_json_listing_matches_the_filter(hub):
    """The fake's tree listing holds the unwanted files: the filter, not the server, drops
    them (guards the pull tests against a server that never offered them)."""
    commit = hub.repos["org/tiny"].revisions["main"]
    names = set(hub.repos["org/tiny"].commits[commit])
    assert set(UNWANTED) <= names
    kept = set(huggingface_hub.utils.filter_repo_objects(
        names, allow_patterns=download.HUB_ALLOW_PATTERNS,
        ignore_patterns=download.HUB_IGNORE_PATTERNS))
    assert kept == set(WANTED)
