"""``LLMEngine.get_info()`` on SmolLM2-135M against what the engine holds: the KV tensors it
allocated, the weight format its config resolved to, the checkpoint's name; the async engine
publishes the same ``EngineInfo``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from localchat.engine.async_engine import AsyncLLMEngine
from localchat.engine.outputs import EngineInfo, float_format

from .kv_cache.test_prefix_caching_model import variant


def test_info_matches_the_loaded_engine(smollm2_engine, smollm2_gguf):
    eng = smollm2_engine
    info = eng.get_info()
    c = eng.model_config
    assert info.model == smollm2_gguf.name and info.draft is None and info.num_spec_tokens == 0
    assert (info.dtype, info.device) == (torch.float32, torch.device("cpu"))
    assert info.max_model_len == eng.max_model_len
    # K and V for every slot of every layer: 2 x layers x slots x kv heads x head dim x 4 bytes.
    slots = info.num_blocks * info.block_size
    assert info.block_size == eng.config.cache.block_size
    assert info.kv_cache_bytes == 2 * c.num_hidden_layers * slots * c.num_kv_heads * c.head_dim * 4
    assert info.kv_cache_bytes == sum(t.nbytes for t in eng.runner.kv_caches)
    scheme = eng.config.quant.scheme  # "auto" was resolved at load
    assert info.weight_format == ("fp32" if scheme == "none" else scheme)
    assert info.is_quantized == (scheme != "none")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.max_model_len = 1  # type: ignore[misc]


def test_async_engine_publishes_the_same_info(smollm2_engine):
    base = variant(smollm2_engine, block_size=16)
    eng = AsyncLLMEngine(base)
    try:
        assert eng.get_info() == base.get_info()
        assert isinstance(eng.get_info(), EngineInfo) and eng.get_info().block_size == 16
    finally:
        eng.shutdown()


def test_float_format_names():
    assert [float_format(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == \
        ["fp32", "bf16", "fp16"]
