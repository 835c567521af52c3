"""Damaged weights are refused at load time with one clear line (issue 18): a safetensors
tensor holding NaN/Inf (unquantized and quantized loads), and a GGUF file whose tensor data
is random bytes (``localchat ask`` in a subprocess: exit 1, one error line, nothing on stdout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from localchat.engine.config import QuantConfig
from localchat.engine.errors import ModelLoadError
from localchat.engine.loader import load_model, load_model_config

from ..tiny_models import save_tiny_model

CPU = torch.device("cpu")
BAD = "model.layers.1.mlp.down_proj.weight"


def _load(folder, quant=None):
    config = load_model_config(folder)
    return load_model(folder, config, dtype=torch.float32, device=CPU, max_position=64,
                      quant=quant)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("scheme", ["none", "int8"])
def test_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path, value, scheme):
    save_tiny_model("llama", tmp_path)
    quant = QuantConfig(scheme=scheme)
    _load(tmp_path, quant)  # the clean checkpoint loads
    weights = load_file(tmp_path / "model.safetensors")
    weights[BAD][3, 5] = value
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as info:
        _load(tmp_path, quant)
    message = str(info.value)
    assert f"tensor {BAD} holds 1 NaN/Inf value(s)" in message and "\n" not in message


def test_gguf_with_random_tensor_data_is_one_error_line(smollm2_gguf, tmp_path):
    from localchat.engine.loader.gguf import open_gguf

    offset = min(int(t.data_offset) for t in open_gguf(smollm2_gguf).tensors)
    damaged = tmp_path / "damaged.gguf"
    shutil.copyfile(smollm2_gguf, damaged)
    data = np.memmap(damaged, dtype=np.uint8, mode="r+")
    rng = np.random.default_rng(18)
    data[offset:] = rng.integers(0, 256, size=data.shape[0] - offset, dtype=np.uint8)
    data.flush()
    del data
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(tmp_path / "home")
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "ask", "-m", str(damaged),
                           "--quant", "none", "--no-save", "hi"], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, timeout=600, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and proc.stdout == b"", err
    assert err.count("\n") == 1 and err.startswith(f"localchat: error: {damaged}: tensor ")
    assert "NaN/Inf" in err


def test_an_all_nan_first_forward_is_one_clear_error(smollm2_engine, monkeypatch):
    import dataclasses

    from localchat.engine.config import CacheConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams

    base = smollm2_engine
    model = base.runner.model

    def fresh():
        config = dataclasses.replace(base.config, cache=CacheConfig())
        return LLMEngine(model, base.model_config, base.tokenizer, config, base.max_model_len)

    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    ids = base.tokenizer.encode("Hello")
    assert len(list(fresh().generate(ids, greedy))) >= 1  # the same model, finite: answers
    real = model.compute_logits
    monkeypatch.setattr(model, "compute_logits", lambda h: real(h) * float("nan"))
    with pytest.raises(ModelLoadError, match="first forward pass gave NaN/Inf logits"):
        list(fresh().generate(ids, greedy))


def test_nan_logits_name_the_cache_entry_they_were_mapped_from(tmp_path):
    """A damaged cache entry is mapped again on every load: the error says which to delete."""
    from localchat.engine.model_runner import check_first_logits

    nan = torch.full((2, 5), float("nan"))
    check_first_logits(torch.zeros(2, 5), tmp_path / "entry.safetensors")  # finite: no error
    with pytest.raises(ModelLoadError) as err:
        check_first_logits(nan, tmp_path / "entry.safetensors")
    message = str(err.value)
    assert f"deleting the cached weights {tmp_path / 'entry.safetensors'}" in message
    assert "\n" not in message
    with pytest.raises(ModelLoadError, match="--quant none, or check the model file"):
        check_first_logits(nan)
