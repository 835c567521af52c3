"""The KV cache's element type (``CacheConfig.kv_cache_dtype``, ``config.kv_cache_dtype``):
``auto`` is fp16 under an fp32 CPU engine (llama.cpp's default f16 cache) and the model's
dtype elsewhere; an explicit type is taken where the attention kernels read it (the engine's
own dtype, or a 16-bit cache under fp32 on CPU) and refused with a clear message elsewhere;
an engine allocates, counts and plans its pool in that type (its accuracy against
transformers: ``test_real_model.test_default_fp16_kv_cache_stays_near_transformers``)."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.config import CacheConfig, EngineConfig, kv_cache_dtype
from localchat.engine.sampling_params import SamplingParams

from .test_prefix_caching_model import variant


@pytest.mark.parametrize("setting,device,dtype,want", [
    ("auto", "cpu", torch.float32, torch.float16),
    ("auto", "cpu", torch.bfloat16, torch.bfloat16),
    ("auto", "cuda", torch.float16, torch.float16),
    ("auto", "cuda", torch.float32, torch.float32),
    ("float32", "cpu", torch.float32, torch.float32),
    ("bfloat16", "cpu", torch.float32, torch.bfloat16),
    ("float16", "cpu", torch.float32, torch.float16),
    ("bfloat16", "cpu", torch.bfloat16, torch.bfloat16),
    ("float16", "cuda", torch.float16, torch.float16),
])
def test_resolution(setting, device, dtype, want):
    assert kv_cache_dtype(setting, device, dtype) == want


@pytest.mark.parametrize("setting,device,dtype", [
    ("float16", "cpu", torch.bfloat16),   # a 16-bit query reads only its own type
    ("float32", "cpu", torch.bfloat16),
    ("float16", "cuda", torch.float32),   # the Triton kernels read the model's dtype
    ("bfloat16", "cuda", torch.float16),
])
def test_refusals_name_the_setting_and_why(setting, device, dtype):
    with pytest.raises(ValueError, match=f"kv_cache_dtype {setting} needs a CPU engine "
                                         "computing in float32"):
        kv_cache_dtype(setting, device, dtype)


def test_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32"):
        CacheConfig(kv_cache_dtype="q8_0")
    config = EngineConfig(device="cpu", dtype=torch.float32,
                          cache=CacheConfig(kv_cache_dtype="bfloat16"))
    assert config.resolved_kv_dtype() == torch.bfloat16


@pytest.mark.parametrize("setting,dtype,size", [("float16", torch.float16, 2),
                                                ("bfloat16", torch.bfloat16, 2),
                                                ("float32", torch.float32, 4)])
def test_engine_allocates_and_counts_its_pool_in_the_type(smollm2_engine, setting, dtype, size):
    eng = variant(smollm2_engine, kv_cache_dtype=setting, num_blocks=8)
    c = eng.model_config
    assert eng.kv_dtype == dtype and all(t.dtype == dtype for t in eng.runner.kv_caches)
    assert eng.kv_bytes_per_token == 2 * c.num_hidden_layers * c.num_kv_heads * c.head_dim * size
    assert eng.get_info().kv_cache_bytes == sum(t.nbytes for t in eng.runner.kv_caches) \
        == 8 * 16 * eng.kv_bytes_per_token
    eng.add_request("r", eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]),
        SamplingParams(temperature=0.0, max_tokens=12))
    text = ""
    while eng.has_unfinished_requests():
        for out in eng.step():
            text = out.text if out.finished else text
    assert "Paris" in text
