"""A fake ``huggingface_hub.snapshot_download`` over a dict of files, for the resolver's tests
at the API boundary (``test_resolve.py``, ``test_resolve_special_paths.py``): no server, no
network; ``hub_gguf``'s listing calls (``HfApi.list_repo_tree``, ``repo_info``) answered from
the same files, and the client's cache pointed at a temporary folder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub import utils as hf_utils
from huggingface_hub.file_download import DryRunFileInfo


def hub_error(cls, message="boom"):
    """An instance of a Hub exception without building an HTTP response."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    return exc


class FakeHub:
    """snapshot_download over a dict of repos; a repo is 'cached' once downloaded."""

    def __init__(self, root: Path):
        self.root = root
        self.calls: list[dict] = []
        self.cached: set[tuple[str, str | None]] = set()
        self.files = {"config.json": b"{}", "model.safetensors": b"x" * 100}
        self.fail_with: BaseException | None = None

    def __call__(self, repo_id, **kw):
        if self.fail_with is not None:
            self.calls.append({"repo_id": repo_id, **kw})
            raise self.fail_with
        if kw.get("dry_run"):  # the file list with sizes, before the download itself
            return [DryRunFileInfo("0" * 40, len(data), name, "", False, True)
                    for name, data in self.files.items()]
        self.calls.append({"repo_id": repo_id, **kw})
        key = (repo_id, kw.get("revision"))
        if kw.get("local_files_only") and key not in self.cached:
            raise hub_error(hf_utils.LocalEntryNotFoundError, "not cached")
        folder = self.root / repo_id.replace("/", "--") / (kw.get("revision") or "main")
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            (folder / name).write_bytes(data)
        self.cached.add(key)
        return str(folder)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch) -> FakeHub:
    fake = FakeHub(tmp_path / "hf")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)

    def list_repo_tree(self, repo_id, **kw):  # hub_gguf's listing: never the real Hub
        fake.calls.append({"repo_id": repo_id, "list_repo_tree": True, **kw})
        return [SimpleNamespace(path=name, size=len(data)) for name, data in fake.files.items()]

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", list_repo_tree)
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info",
                        lambda self, repo_id, **kw: SimpleNamespace(sha="0" * 40))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return fake
