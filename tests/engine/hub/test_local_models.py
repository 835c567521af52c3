"""Downloaded models (``engine/hub/local_models.py``): the HF cache's loadable models listed,
and ``remove_model`` deleting a bundle, a Hub GGUF file or a Hub snapshot with the files loads
derived from it, never a user's own file. Downloads come from the fake Hub on 127.0.0.1
(``test_hub_gguf``'s fixtures); the bundle is a sparse file of the catalog's size."""

from __future__ import annotations

import os

import pytest

from localchat.engine.errors import ModelNotFoundError
from localchat.engine.hub.catalog import resolve_alias
from localchat.engine.hub.local_models import hub_downloads, remove_model
from localchat.engine.hub.resolve import bundle_path, resolve_model
from localchat.engine.quant.cache import model_cache_key
from tests.engine.hub.test_hub_gguf import GGUF_REPO, HF_REPO, fake_gguf, hf, hub, repo  # noqa: F401


@pytest.fixture
def pulled(hf, hub, tmp_path):  # noqa: F811 - the fixtures imported above
    """``org/gguf`` (two of its GGUF files) and ``org/hf`` (an HF-format snapshot) pulled into
    the temporary HF cache; a derived file of each in ``cache_dir``."""
    hub.repos["org/hf"] = repo(HF_REPO)
    cache = tmp_path / "lc"
    sources = {spec: resolve_model(spec, cache_dir=cache)
               for spec in ("org/gguf:Q4_K_M", "org/gguf:Q8_0", "org/hf")}
    derived = {}
    for spec, source in sources.items():
        key = model_cache_key(source.path)
        derived[spec] = [cache / "quant" / f"{key}-native-g32-float32-v8.safetensors",
                         cache / "gguf-meta" / key / "config.json"]
        for path in derived[spec]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"d" * 10)
    return cache, sources, derived


def test_hub_downloads_lists_the_loadable_models(pulled):
    _, sources, _ = pulled
    rows = {d.spec: d for d in hub_downloads()}
    assert set(rows) == {"org/gguf:Model-Q4_K_M.gguf", "org/gguf:Model-Q8_0.gguf", "org/hf"}
    q4 = rows["org/gguf:Model-Q4_K_M.gguf"]
    assert q4.path == sources["org/gguf:Q4_K_M"].path
    assert q4.size_bytes == len(GGUF_REPO["Model-Q4_K_M.gguf"])
    assert rows["org/hf"].path == sources["org/hf"].path
    for spec, row in rows.items():  # each listed spec resolves to the same model, offline
        assert resolve_model(spec, cache_dir=pulled[0], download=False).path == row.path


def test_remove_a_hub_gguf_file_keeps_the_repos_other_files(pulled):
    cache, sources, derived = pulled
    path = sources["org/gguf:Q4_K_M"].path
    blob = path.resolve()
    removed = remove_model("org/gguf:Q4_K_M", cache)
    assert removed.paths == [path] and removed.bytes == len(GGUF_REPO["Model-Q4_K_M.gguf"])
    assert not path.exists() and not blob.exists()
    quant, meta = derived["org/gguf:Q4_K_M"]
    assert sorted(removed.derived) == sorted([quant, meta.parent])  # (its metadata folder)
    assert not any(p.exists() for p in derived["org/gguf:Q4_K_M"])
    assert sources["org/gguf:Q8_0"].path.exists()  # the other file and its derived files stay
    assert all(p.exists() for p in derived["org/gguf:Q8_0"])
    assert {d.spec for d in hub_downloads()} == {"org/gguf:Model-Q8_0.gguf", "org/hf"}
    with pytest.raises(ModelNotFoundError, match="is not downloaded: nothing to remove"):
        remove_model("org/gguf:Q4_K_M", cache)


def test_remove_a_hub_snapshot(pulled):
    cache, sources, derived = pulled
    folder = sources["org/hf"].path
    removed = remove_model("org/hf", cache)
    assert removed.paths == [folder] and not folder.exists()
    assert removed.bytes >= len(HF_REPO["model.safetensors"])
    assert not any(p.exists() for p in derived["org/hf"])
    assert {d.spec for d in hub_downloads()} == {"org/gguf:Model-Q4_K_M.gguf",
                                                 "org/gguf:Model-Q8_0.gguf"}


def test_remove_a_bundle_and_refuse_a_users_own_file(tmp_path):
    entry = resolve_alias("smollm2-135m")
    path = bundle_path(entry, tmp_path)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:  # sparse: the catalog's size, a GGUF's first bytes
        f.write(b"GGUF")
        f.truncate(entry.bundle.total_bytes)
    key = model_cache_key(path)
    quant = tmp_path / "quant" / f"{key}-int4-g32-float32.safetensors"
    other = tmp_path / "quant" / "Other-0123456789abcdef-int4-g32-float32.safetensors"
    for p in (quant, other):
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"q")
    removed = remove_model("smollm2-135m", tmp_path)
    assert removed.paths == [path] and removed.bytes == entry.bundle.total_bytes
    assert removed.derived == [quant] and other.exists()
    assert not path.parent.exists()  # the alias's emptied folder goes too
    own = tmp_path / "mine.gguf"
    own.write_bytes(fake_gguf("mine"))
    with pytest.raises(ModelNotFoundError, match="is a local file or folder, not a downloaded"):
        remove_model(str(own), tmp_path)
    assert own.exists()
    with pytest.raises(ModelNotFoundError, match="not a model alias"):
        remove_model("no-such-alias", tmp_path)
    os.remove(own)


def test_models_lists_and_rm_removes_through_the_cli(pulled, monkeypatch, capsys, tmp_path):
    """``localchat models`` shows the Hub downloads beside the catalog; ``localchat rm``
    removes each spec it can, names each one it cannot in one line, and exits 1 then."""
    from localchat.app import cli, cli_io

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    command = cli.typer.main.get_command(cli.app)
    assert cli_io.run_cli(command, ["models"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "smollm2-135m" in rows  # the catalog stays
    assert rows["org/gguf:Model-Q8_0.gguf"].split()[1:3] == ["hub", "(downloaded)"]
    assert "org/hf" in rows
    code = cli_io.run_cli(command, ["rm", "org/gguf:Q8_0", "org/none:Q4_K_M"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 2, err
    assert err.startswith("localchat: note: removed org/gguf:Q8_0: ")
    assert err.endswith("localchat: error: org/none:Q4_K_M is not downloaded: nothing to "
                        "remove\n")
    assert not pulled[1]["org/gguf:Q8_0"].path.exists()
