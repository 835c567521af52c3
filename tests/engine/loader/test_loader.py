"""Checkpoint loading: errors a user can cause, and the GGUF metadata cache."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from localchat.engine.errors import ModelLoadError, UnsupportedArchitectureError
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.loader.gguf import iter_gguf_tensors

from ..tiny_models import save_tiny_model

CPU = torch.device("cpu")


def _load(folder):
    config = load_model_config(folder)
    return load_model(folder, config, dtype=torch.float32, device=CPU, max_position=64)


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    save_tiny_model("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError) as err:
        _load(tmp_path)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "Qwen3ForCausalLM" in msg and "\n" not in msg


def test_truncated_safetensors_is_a_clear_error(tmp_path):
    save_tiny_model("qwen2", tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        _load(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    save_tiny_model("qwen3", tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(ModelLoadError, match="k_norm"):
        _load(tmp_path)


def test_no_safetensors_refuses_pickles(tmp_path):
    save_tiny_model("llama", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="safetensors"):
        _load(tmp_path)


def test_cached_gguf_tensor_table_gives_identical_weights(smollm2_gguf, tmp_path):
    """Tensors read through the cached table equal those from a fresh GGUFReader parse."""
    first = dict(iter_gguf_tensors(smollm2_gguf, 9, 3, torch.float32, cache_dir=tmp_path))
    assert (next(tmp_path.glob("gguf-meta/*")) / "tensors.json").is_file()
    second = iter_gguf_tensors(smollm2_gguf, 9, 3, torch.float32, cache_dir=tmp_path)
    uncached = iter_gguf_tensors(smollm2_gguf, 9, 3, torch.float32, cache_dir=None)
    n = 0
    for (name_a, a), (name_b, b) in zip(second, uncached):
        assert name_a == name_b
        assert torch.equal(a, b) and torch.equal(first[name_a], a)
        n += 1
    assert n == len(first) == 272


def test_truncated_gguf_is_a_clear_error(smollm2_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    with open(smollm2_gguf, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelLoadError, match="truncated|corrupt"):
        load_model_config(bad, cache_dir=tmp_path)


def test_gguf_with_truncated_tensor_data_is_a_clear_error(smollm2_gguf, tmp_path):
    """Metadata intact, the last tensors cut off: the tensor reader says so."""
    bad = tmp_path / "cut.gguf"
    shutil.copyfile(smollm2_gguf, bad)
    with open(bad, "r+b") as f:
        f.truncate(bad.stat().st_size - 4096)
    with pytest.raises(ModelLoadError, match="truncated|corrupt"):
        for _ in iter_gguf_tensors(bad, 9, 3, torch.float32, cache_dir=tmp_path):
            pass
