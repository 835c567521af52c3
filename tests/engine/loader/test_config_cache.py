"""The cached ``ModelConfig`` of a GGUF file (``engine/loader/config_cache.py``).

Reference: the config derived from transformers' own conversion of the same file
(``AutoConfig.from_pretrained(folder, gguf_file=...)`` through ``ModelConfig.from_hf_config``),
computed without any engine cache. A stale (older version), corrupt or incomplete entry must
be rebuilt to that reference, never trusted; a cached load imports no transformers.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from localchat.engine import loader
from localchat.engine.loader.config_cache import CONFIG_CACHE_FILE, CONFIG_CACHE_VERSION
from localchat.engine.loader.gguf import meta_dir


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """SmolLM2's ModelConfig straight from transformers (no cache folder at all)."""
    return loader.load_model_config(smollm2_gguf)


@pytest.fixture(scope="module")
def cached_root(smollm2_gguf, tmp_path_factory):
    """A cache folder holding SmolLM2's config entry (built once, through transformers)."""
    root = tmp_path_factory.mktemp("config-cache")
    loader._CONFIG_MEMO.clear()
    loader.load_model_config(smollm2_gguf, root)
    return root


def _entry(gguf: Path, root: Path) -> Path:
    return meta_dir(gguf, root) / CONFIG_CACHE_FILE


def _load_fresh(gguf: Path, root: Path):
    loader._CONFIG_MEMO.clear()
    return loader.load_model_config(gguf, root)


def test_entry_equals_transformers_config(smollm2_gguf, cached_root, reference):
    entry = json.loads(_entry(smollm2_gguf, cached_root).read_text())
    assert entry["version"] == CONFIG_CACHE_VERSION
    assert entry["source"].startswith("transformers ")
    assert entry["config"] == dataclasses.asdict(reference)
    assert _load_fresh(smollm2_gguf, cached_root) == reference
    assert reference.tie_word_embeddings  # SmolLM2's GGUF has no output.weight


@pytest.mark.parametrize("damage", ["stale_version", "not_json", "missing_field", "bad_type",
                                    "empty"])
def test_damaged_or_stale_entry_is_rebuilt(smollm2_gguf, cached_root, reference, damage,
                                           monkeypatch):
    file = _entry(smollm2_gguf, cached_root)
    good = json.loads(file.read_text())
    bad = json.loads(json.dumps(good))
    if damage == "stale_version":
        bad["version"] = CONFIG_CACHE_VERSION - 1
        bad["config"]["num_hidden_layers"] = 2  # an old entry must not be trusted
    elif damage == "missing_field":
        del bad["config"]["head_dim"]
    elif damage == "bad_type":
        bad["config"]["hidden_size"] = "576"
    text = {"not_json": "{ truncated", "empty": ""}.get(damage, json.dumps(bad))
    file.write_text(text)
    conversions = []
    real = loader._model_config_from_hf
    monkeypatch.setattr(loader, "_model_config_from_hf",
                        lambda *a: conversions.append(a) or real(*a))
    assert _load_fresh(smollm2_gguf, cached_root) == reference
    assert len(conversions) == 1  # rebuilt from transformers
    assert json.loads(file.read_text()) == good  # and rewritten
    assert _load_fresh(smollm2_gguf, cached_root) == reference
    assert len(conversions) == 1  # the rebuilt entry is used


def test_cached_config_imports_no_transformers(smollm2_gguf, cached_root, reference):
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from localchat.engine.loader import load_model_config\n"
        f"c = load_model_config(Path({str(smollm2_gguf)!r}), Path({str(cached_root)!r}))\n"
        "print(c.num_hidden_layers, c.vocab_size, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    expected = f"{reference.num_hidden_layers} {reference.vocab_size} False"
    assert out.stdout.strip() == expected, out.stderr[-2000:]


def test_cached_engine_load_imports_no_transformers_or_dynamo(smollm2_gguf, cache_dir):
    """A whole cached engine load and one greedy token, in a fresh process: none of
    transformers, torch._dynamo or sympy is imported (seconds of startup each)."""
    loader._CONFIG_MEMO.clear()
    loader.load_model_config(smollm2_gguf, cache_dir)  # make sure the entry exists
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from localchat.engine.config import EngineConfig, QuantConfig\n"
        "from localchat.engine.llm_engine import LLMEngine\n"
        "from localchat.engine.sampling_params import SamplingParams\n"
        f"e = LLMEngine.from_path(Path({str(smollm2_gguf)!r}),"
        " EngineConfig(quant=QuantConfig(scheme='native')),"
        f" cache_dir=Path({str(cache_dir)!r}))\n"
        "ids = e.tokenizer.apply_chat_template([{'role': 'user', 'content': 'Hi'}])\n"
        "out = list(e.generate(ids, SamplingParams(temperature=0.0, max_tokens=2)))\n"
        "print(len(out[-1].token_ids) if hasattr(out[-1], 'token_ids') else len(out),"
        " [m for m in ('transformers', 'torch._dynamo', 'sympy') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("[]"), (out.stdout, out.stderr[-2000:])
