"""GGUF files from any Hub repo (``org/name:Q4_K_M``, file URLs, a plain GGUF-only repo)
against the fake Hub on 127.0.0.1 with the real ``huggingface_hub`` client.

``resolve_model`` runs in-process with the client's endpoint and cache pointed at the fake
server and a temporary folder (the CLI's lines: ``test_hub_gguf_cli.py``). The fake's request
log tells which files were fetched. No test touches the real network.
"""

from __future__ import annotations

import shutil
from collections import namedtuple

import huggingface_hub
import pytest
from huggingface_hub import constants

from localchat.engine.errors import ModelDownloadError, ModelNotFoundError
from localchat.engine.hub.hub_gguf import choose, quant_label, tag_matches
from localchat.engine.hub.resolve import GgufSpec, parse_gguf_spec, parse_repo_spec, resolve_model
from tests.engine.hub.fake_hub_server import FakeHub, FakeRepo


def fake_gguf(label: str) -> bytes:
    """Bytes that start like a GGUF file (resolve never parses them)."""
    return b"GGUF" + label.encode() * 50


GGUF_REPO = {
    "README.md": b"# a GGUF repo",
    "Model-Q4_K_M.gguf": fake_gguf("q4km"),
    "Model-Q8_0.gguf": fake_gguf("q80"),
    "Model-Q4_K_S.gguf": fake_gguf("q4ks"),
    "mmproj-Model-Q4_K_M.gguf": fake_gguf("mmproj"),
    "sub/other.gguf": fake_gguf("other"),
}
HF_REPO = {"config.json": b"{}", "model.safetensors": b"w" * 100, "tokenizer.json": b"{ }",
           "Model-Q4_K_M.gguf": fake_gguf("hf-side")}
SECRET = "hf_fakeTOKENthatMustNeverShow456"


def repo(files: dict[str, bytes], **kw) -> FakeRepo:
    r = FakeRepo(**kw)
    r.add_commit(files, "main")
    return r


@pytest.fixture
def hub():
    with FakeHub() as server:
        server.repos["org/gguf"] = repo(GGUF_REPO)
        server.repos["org/gguf"].add_commit({"Model-Q4_K_M.gguf": fake_gguf("v1")}, "v1")
        server.repos["org/lower"] = repo({"model.q8_0.gguf": fake_gguf("q80"),
                                          "model.f16.gguf": fake_gguf("f16")})
        server.repos["org/k"] = repo({"x-Q4_K_M.gguf": fake_gguf("q4km")})
        server.repos["org/both-k"] = repo({"x-Q4_K_M.gguf": fake_gguf("km"),
                                           "x-Q4_K.gguf": fake_gguf("k")})
        server.repos["org/dup"] = repo({"a/x-Q4_K_M.gguf": fake_gguf("a"),
                                        "b/x-Q4_K_M.gguf": fake_gguf("b")})
        server.repos["org/split"] = repo({"x-Q4_K_M-00001-of-00002.gguf": fake_gguf("1"),
                                          "x-Q4_K_M-00002-of-00002.gguf": fake_gguf("2")})
        server.repos["org/hf"] = repo(HF_REPO)
        server.repos["org/empty"] = repo({"README.md": b"# nothing"})
        server.repos["org/gated"] = repo(GGUF_REPO, gated=True, token=SECRET)
        yield server


@pytest.fixture
def hf(hub, tmp_path, monkeypatch):
    """The real client, in-process, against the fake Hub, with an empty cache."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # get_token reads no real token file
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    return tmp_path


def resolve(spec, tmp_path, **kw):
    return resolve_model(spec, cache_dir=tmp_path / "lc", **kw)


def commit_of(hub, repo_id, ref="main"):
    return hub.repos[repo_id].revisions[ref]


# -- spec forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("org/name:Q4_K_M", GgufSpec("org/name", None, "Q4_K_M")),
    (" org/name@v1.0:q8_0 ", GgufSpec("org/name", "v1.0", "q8_0")),
    ("hf.co/org/name:Q4_K_M", GgufSpec("org/name", None, "Q4_K_M")),
    ("https://huggingface.co/org/name:UD-Q4_K_XL", GgufSpec("org/name", None, "UD-Q4_K_XL")),
    ("org/name:sub/x-Q4_K_M.gguf", GgufSpec("org/name", None, None, "sub/x-Q4_K_M.gguf")),
    ("org/name:latest", GgufSpec("org/name")),
    ("https://huggingface.co/org/name/blob/main/sub/x.gguf",
     GgufSpec("org/name", "main", None, "sub/x.gguf")),
    ("huggingface.co/org/name/resolve/v2/x.gguf?download=true",
     GgufSpec("org/name", "v2", None, "x.gguf")),
    ("hf.co/org/name/blob/refs%2Fpr%2F1/my%20x.gguf",
     GgufSpec("org/name", "refs/pr/1", None, "my x.gguf")),
    ("org/name", None), ("org/name:", None), ("a/b/c:Q4_K_M", None), ("org/name:Q4:K", None),
    ("https://example.com/org/name:Q4_K_M", None), ("./org/name:Q4_K_M", None),
    ("https://huggingface.co/org/name/blob/main/README.md", None),
])  # fmt: skip
def test_parse_gguf_spec(text, expected):
    assert parse_gguf_spec(text) == expected
    if expected is not None:
        assert parse_repo_spec(text) is None  # the repo-only parser keeps its behaviour


@pytest.mark.parametrize(("tag", "path", "match"), [
    ("Q4_K_M", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", True),
    ("q4_k_m", "model.Q4_K_M.gguf", True),
    ("Q4_K_M", "Q4_K_M/x-Q4_K_M_imatrix.gguf", True),
    ("Q4_K", "x-Q4_K_M.gguf", False),
    ("Q4_0", "x-Q4_0_4_4.gguf", False),
    ("Q6_K", "x-Q6_K_L.gguf", False),
    ("Q8_0", "xQ8_0.gguf", False),
    ("gguf", "x.gguf", False),
])  # fmt: skip
def test_tag_matches_whole_tokens(tag, path, match):
    assert tag_matches(tag, path) is match


def test_quant_labels():
    assert [quant_label(p) for p in ("model.q4_k_m.gguf", "x-IQ2_XXS.gguf", "a-f16.gguf",
                                     "x-Q4_K_M-00001-of-00002.gguf", "plain.gguf")] == [
        "Q4_K_M", "IQ2_XXS", "F16", "Q4_K_M", None]


def test_a_gguf_of_one_part_is_whole_not_split():
    """``-00001-of-00001`` (unsloth's single files) is a whole model; two parts are refused."""
    spec = GgufSpec("org/u", tag="Q6_K")
    one = "Model-Q6_K-00001-of-00001.gguf"
    assert choose(spec, [one, "README.md"]) == one
    with pytest.raises(ModelNotFoundError, match="split GGUF file"):
        choose(spec, ["Model-Q6_K-00001-of-00002.gguf", "Model-Q6_K-00002-of-00002.gguf"])


def test_a_url_of_no_form_read_is_named_as_such(tmp_path):
    """A URL localchat does not read (not a model page or a .gguf file's) is not called a
    missing local file."""
    for url in ("https://huggingface.co/org/x/blob/main/README.md",
                "https://example.com/a/b/resolve/main/x.gguf",
                "https://huggingface.co/datasets/org/x"):
        with pytest.raises(ModelNotFoundError, match="is not a model URL localchat reads"):
            resolve_model(url, cache_dir=tmp_path, download=False)


def test_choose_excludes_mmproj():
    spec = GgufSpec("org/m", tag="Q4_K_M")
    assert choose(spec, ["mmproj-x-Q4_K_M.gguf", "x-Q4_K_M.gguf"]) == "x-Q4_K_M.gguf"
    with pytest.raises(ModelNotFoundError, match="^org/m holds no GGUF model file "):
        choose(spec, ["mmproj-x-Q4_K_M.gguf", "README.md"])


# -- downloads and the cache -----------------------------------------------------------------


def test_tag_fetches_only_that_file_with_progress(hf, hub, capsys):
    lines: list[str] = []
    src = resolve("org/gguf:q4_k_m", hf, progress=lines.append)
    commit = commit_of(hub, "org/gguf")
    assert src.path == hf / "hf" / "hub" / "models--org--gguf" / "snapshots" / commit / \
        "Model-Q4_K_M.gguf"
    assert (src.format, src.alias, src.catalog_entry, src.spec) == ("gguf", None, None,
                                                                   "org/gguf:q4_k_m")
    assert src.path.read_bytes() == GGUF_REPO["Model-Q4_K_M.gguf"]
    assert hub.fetched() == ["Model-Q4_K_M.gguf"]
    size = len(GGUF_REPO["Model-Q4_K_M.gguf"])
    line = f"Model-Q4_K_M.gguf, {size} B into {hf / 'hf' / 'hub'}"
    assert lines == ["downloading org/gguf:q4_k_m from the Hugging Face Hub: " + line]
    assert "localchat: org/gguf:q4_k_m: " in capsys.readouterr().err  # the byte bar


def test_a_cached_file_resolves_without_the_network(hf, hub, monkeypatch):
    first = resolve("org/gguf:Q8_0", hf).path
    kept = huggingface_hub.get_cached_repo_tree("org/gguf")  # the whole listing, kept
    assert {f.path for f in kept} == set(GGUF_REPO)
    hub.requests.clear()
    assert resolve("org/gguf:Q8_0", hf, download=False).path == first
    assert resolve("hf.co/org/gguf:q8_0", hf).path == first
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve("org/gguf:Model-Q8_0.gguf", hf).path == first
    assert hub.requests == []
    with pytest.raises(ModelNotFoundError) as err:  # another tag: not cached
        resolve("org/gguf:Q4_K_S", hf, download=False)
    assert str(err.value) == ("org/gguf:Q4_K_S is not downloaded yet; run "
                              "`localchat pull org/gguf:Q4_K_S`")
    with pytest.raises(ModelDownloadError, match="HF_HUB_OFFLINE is set"):
        resolve("org/gguf:Q4_K_S", hf)
    assert hub.requests == []


def test_not_cached_without_download(hf, hub):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("org/gguf:Q4_K_M", hf, download=False)
    assert "run `localchat pull org/gguf:Q4_K_M`" in str(err.value)
    assert hub.requests == []


def test_plain_gguf_repo_takes_q4_k_m_like_ollama(hf, hub):
    src = resolve("org/gguf", hf)
    assert src.format == "gguf" and src.path.name == "Model-Q4_K_M.gguf"
    assert hub.fetched() == ["Model-Q4_K_M.gguf"]  # no README, no other quant, no mmproj
    hub.requests.clear()
    assert resolve("org/gguf", hf, download=False).path == src.path
    assert resolve("https://huggingface.co/org/gguf", hf).path == src.path
    assert resolve("org/gguf:latest", hf).path == src.path
    assert hub.requests == []


def test_plain_gguf_repo_without_q4_k_m_names_the_tags(hf, hub):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("org/lower", hf)
    assert str(err.value) == ("org/lower holds GGUF files, none of them Q4_K_M; name one: "
                              "org/lower:F16 (or Q8_0)")
    assert hub.fetched() == []
    src = resolve("org/lower:Q8_0", hf)  # case-insensitive: model.q8_0.gguf
    assert src.path.name == "model.q8_0.gguf"
    hub.requests.clear()  # offline, from the listing the cache keeps: the same line
    with pytest.raises(ModelNotFoundError, match="none of them Q4_K_M; name one: org/lower:F16"):
        resolve("org/lower", hf, download=False)
    assert hub.requests == []


def test_q4_k_does_not_pick_q4_k_m(hf, hub):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("org/k:Q4_K", hf)
    assert str(err.value) == "org/k has no Q4_K GGUF file; name one: org/k:Q4_K_M"
    assert hub.fetched() == []
    assert resolve("org/both-k:Q4_K", hf).path.name == "x-Q4_K.gguf"
    assert resolve("org/both-k:Q4_K_M", hf).path.name == "x-Q4_K_M.gguf"


def test_file_urls_and_paths_at_a_revision(hf, hub):
    v1 = resolve("https://huggingface.co/org/gguf/blob/v1/Model-Q4_K_M.gguf", hf)
    assert v1.path.parent.name == commit_of(hub, "org/gguf", "v1")
    assert v1.path.read_bytes() == fake_gguf("v1")
    sub = resolve("hf.co/org/gguf/resolve/main/sub/other.gguf", hf)
    assert sub.path.read_bytes() == GGUF_REPO["sub/other.gguf"]
    assert resolve("org/gguf:sub/other.gguf", hf, download=False).path == sub.path
    assert sorted(hub.fetched()) == ["Model-Q4_K_M.gguf", "sub/other.gguf"]
    with pytest.raises(ModelNotFoundError) as err:
        resolve("org/gguf:sub/absent.gguf", hf)
    assert str(err.value).startswith("org/gguf has no file sub/absent.gguf; name one: ")


def test_one_line_refusals(hf, hub):
    cases = {
        "org/dup:Q4_K_M": "org/dup:Q4_K_M matches several GGUF files (a/x-Q4_K_M.gguf, "
                          "b/x-Q4_K_M.gguf); name one by its path: org/dup:a/x-Q4_K_M.gguf",
        "org/split:Q4_K_M": "org/split:Q4_K_M is a split GGUF file "
                            "(x-Q4_K_M-00001-of-00002.gguf, 2 parts): split GGUF files are "
                            "not supported yet; join the parts into one file "
                            "(llama-gguf-split --merge) and give its path",
        "org/gguf:mmproj-Model-Q4_K_M.gguf": "org/gguf:mmproj-Model-Q4_K_M.gguf is a "
                                             "multimodal projector (mmproj), not a model; "
                                             "name one: org/gguf:Q4_K_M (or Q4_K_S, Q8_0, "
                                             "sub/other.gguf)",
        "org/empty:Q4_K_M": "org/empty holds no GGUF model file (':Q4_K_M' names one); for "
                            "an HF-format repo give org/empty alone",
        "org/absent:Q4_K_M": "no Hugging Face Hub repo org/absent (or it is private: set "
                             "HF_TOKEN); run `localchat models` to list the aliases",
        "org/gguf@nope:Q4_K_M": "org/gguf has no revision 'nope'",
    }
    for spec, line in cases.items():
        with pytest.raises(ModelNotFoundError) as err:
            resolve(spec, hf)
        assert str(err.value) == line
    assert hub.fetched() == []


def test_gated_repo_and_token(hf, hub, monkeypatch):
    with pytest.raises(ModelDownloadError, match="is gated on the Hugging Face Hub"):
        resolve("org/gated:Q8_0", hf)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert resolve("org/gated:Q8_0", hf).path.read_bytes() == GGUF_REPO["Model-Q8_0.gguf"]


def test_hf_format_repo_keeps_its_path(hf, hub):
    src = resolve("org/hf", hf)
    assert src.format == "hf" and src.path.name == commit_of(hub, "org/hf")
    assert sorted(hub.fetched()) == ["config.json", "model.safetensors", "tokenizer.json"]
    gguf = resolve("org/hf:Q4_K_M", hf)  # its GGUF file, when asked for
    assert gguf.format == "gguf" and gguf.path.read_bytes() == fake_gguf("hf-side")
    assert resolve("org/hf", hf, download=False).format == "hf"


def test_repo_with_neither_format(hf, hub):
    with pytest.raises(ModelDownloadError) as err:
        resolve("org/empty", hf)
    assert str(err.value) == "org/empty is incomplete: no config.json (not an HF-format model repo)"
    assert hub.fetched() == []


def test_free_disk_is_checked_against_the_listed_size(hf, hub, monkeypatch):
    usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1000))
    with pytest.raises(ModelDownloadError) as err:
        resolve("org/gguf:Q8_0", hf)
    size = len(GGUF_REPO["Model-Q8_0.gguf"])
    assert str(err.value).startswith(f"not enough disk space for org/gguf:Q8_0: it needs {size} B")
    assert hub.fetched() == []


def test_unreachable_hub(hf, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelDownloadError, match="cannot reach the Hugging Face Hub"):
        resolve("org/gguf:Q8_0", hf)


def test_the_tui_check_takes_a_hub_gguf_to_download(hf, hub, monkeypatch):
    """``engine_loader.on_disk`` (the TUI's check before a load): a Hub GGUF spec not cached
    yet is one the load fetches (None), not a spec that names no model."""
    from localchat.app.engine_loader import on_disk

    monkeypatch.setenv("LOCALCHAT_HOME", str(hf / "lc"))
    assert on_disk("hf.co/org/gguf:Q8_0") is None
    assert hub.requests == []
    resolve("org/gguf:Q8_0", hf)
    assert on_disk("org/gguf:q8_0").path.name == "Model-Q8_0.gguf"
