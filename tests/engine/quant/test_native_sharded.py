"""Fused layers whose GGUF shards repack onto different layouts (``engine/quant/sharded.py``).

Qwen2.5-Coder-1.5B's ``qkv_proj`` has Q4_K ``q``, ``k`` (int4, groups of 32, mins) and a Q6_K
``v`` (int8, groups of 16) in half its layers. The native format holds each shard in its own
layout and multiplies shard by shard; before, the layer was widened to one layout holding all
shards (int8, groups of 16, mins), which ``native_method(..., split=False)`` still builds: the
oracle for the values here, beside per-shard ``F.linear`` over gguf's own dequantization.

Shards are random valid GGUF blocks (``test_gguf_repack._random_blocks``), filled through the
loader's own row placement (``repack_into_rows``: the C++ repack straight into the rows where
it is built; ``copy_repacked_rows``: repack, then copy) at each shard's rows of the fused layer.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from localchat.engine.layers.linear import MergedLinear, QKVLinear
from localchat.engine.quant.gguf_repack import GGML_TYPES, repack_gguf_tensor, repacked_group
from localchat.engine.quant.gguf_repack import scale_dtype as gguf_scale_dtype
from localchat.engine.quant.methods import LinearMethod
from localchat.engine.quant.native import (
    Int8GroupLinearMethod,
    NativeInt4LinearMethod,
    copy_repacked_rows,
    native_method,
    repack_into_rows,
)
from localchat.engine.quant.sharded import ShardedLinearMethod, ShardLayer
from localchat.kernels import cpu

from .test_gguf_repack import _random_blocks

TYPE = {v[0]: k for k, v in GGML_TYPES.items()}
K = 256  # in_features: one K-quant super-block per row

# (fused layer, [(shard id, rows, GGUF type)]): Qwen2.5-1.5B's mixed qkv_proj, and a
# gate_up_proj mixing an int4 type with fp16 scales and a symmetric int8 type
CASES = {
    "qkv-q4k-q6k": ("qkv", [("q", 64, "Q4_K"), ("k", 32, "Q4_K"), ("v", 32, "Q6_K")]),
    "gate_up-q4_0-q8_0": ("merged", [(0, 48, "Q4_0"), (1, 48, "Q8_0")]),
}


def _layout(ggml_type: int) -> tuple:
    group, has_mins = repacked_group(ggml_type)
    return (GGML_TYPES[ggml_type][3], group, has_mins, gguf_scale_dtype(ggml_type))


def _fused(kind: str, shards, bias: bool) -> nn.Module:
    if kind == "qkv":
        return QKVLinear(K, shards[0][1], shards[1][1], bias=bias)
    return MergedLinear(K, [rows for _, rows, _ in shards], bias=bias)


def _build(case: str, kernel: str, split: bool, direct: bool, seed: int = 0):
    """The fused layer of ``case`` with random GGUF shards: ``(layer, [(rows, raw, type)])``,
    filled through the loader's placement (``direct``: the C++ repack into the rows where
    built, else repack and copy)."""
    kind, shards = CASES[case]
    layer = _fused(kind, shards, bias=True)
    layouts = [_layout(TYPE[t]) for _, _, t in shards]
    method = native_method(layouts, "cpu", kernel, shards=[(s, n) for s, n, _ in shards],
                           split=split)
    layer.quant_method = method
    method.create_weights(layer, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    layer.bias.data.copy_(torch.randn(layer.out_features, generator=gen))
    raws = []
    for i, (sid, rows, tname) in enumerate(shards):
        ggml_type = TYPE[tname]
        raw = _random_blocks(ggml_type, rows, K, seed=seed * 10 + i)
        start, end = layer.shard_range(sid)
        if not (direct and repack_into_rows(layer, raw, ggml_type, (rows, K), start, end)):
            copy_repacked_rows(layer, repack_gguf_tensor(raw, ggml_type, (rows, K)), start, end)
        raws.append((rows, raw, ggml_type))
    layer.process_weights_after_loading()
    return layer, raws


def _reference(raws, bias, x):
    """Per-shard ``F.linear`` over gguf's fp32 dequantization, concatenated: ``[M, N]``."""
    ys = []
    for rows, raw, ggml_type in raws:
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type))
        ys.append(F.linear(x.double(), torch.from_numpy(np.asarray(w, np.float64))))
    return (torch.cat(ys, dim=-1) + bias.double()).float()


@pytest.mark.parametrize("kernel", ["packed", "dequant"])
@pytest.mark.parametrize("m", [1, 5, 40])  # decode rows (C++ kernels), and prefill rows
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_layer_equals_widened_layer_and_per_shard_linear(case, m, kernel):
    sharded, raws = _build(case, kernel, split=True, direct=True)
    widened, _ = _build(case, kernel, split=False, direct=True)
    method = sharded.quant_method
    assert isinstance(method, ShardedLinearMethod)
    assert not isinstance(widened.quant_method, ShardedLinearMethod)
    # each shard in the method it would get alone
    for child, (_, _, ggml_type) in zip(method.children(sharded), raws):
        alone = native_method([_layout(ggml_type)], "cpu", kernel)
        assert isinstance(child, ShardLayer) and type(child.quant_method) is type(alone)
        if isinstance(alone, Int8GroupLinearMethod):
            assert child.quant_method.group_size == alone.group_size
            assert child.quant_method.has_mins == alone.has_mins
        assert child.quant_method.scale_dtype == alone.scale_dtype
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    with torch.no_grad():
        got = sharded(x)
        old = widened(x)
    want = _reference(raws, sharded.bias, x)
    assert got.shape == (m, sharded.out_features) and got.dtype == torch.float32
    # the same weights, exactly: only fp32 summation order differs (K = 256 terms)
    tol = 1e-5 * want.abs().max().item()
    torch.testing.assert_close(got, old, rtol=1e-5, atol=tol)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=tol)
    # a batched input [B, T, K] is the flat one reshaped
    with torch.no_grad():
        got3 = sharded(x.reshape(1, m, K))
    torch.testing.assert_close(got3.reshape(m, -1), got, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_direct_repack_equals_repack_then_copy(case):
    if not cpu.available():
        pytest.skip("CPU kernels not built")
    direct, _ = _build(case, "dequant", split=True, direct=True)
    copied, _ = _build(case, "dequant", split=True, direct=False)
    a, b = direct.state_dict(), copied.state_dict()
    assert a.keys() == b.keys()
    assert any(name.startswith("shard_") for name in a)
    for name in a:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


@pytest.mark.parametrize("case", list(CASES))
def test_held_bytes_are_the_sum_of_the_shards_layouts(case):
    _, shards = CASES[case]
    layer, raws = _build(case, "dequant", split=True, direct=True)
    widened, _ = _build(case, "dequant", split=False, direct=True)
    n = layer.out_features
    held = sum(t.numel() * t.element_size() for name, t in layer.named_buffers())
    per_shard = sum(native_method([_layout(TYPE[t])], "cpu", "dequant").weight_bytes(
        rows, K, torch.float32) for _, rows, t in shards)
    assert held == per_shard == layer.quant_method.weight_bytes(n, K, torch.float32)
    # each shard holds its GGUF type's own layout: the repacked tensor's bytes
    assert held == sum(repack_gguf_tensor(raw, t, (rows, K)).nbytes() for rows, raw, t in raws)
    widened_held = sum(t.numel() * t.element_size() for _, t in widened.named_buffers())
    assert held < widened_held
    assert widened.quant_method.weight_bytes(n, K, torch.float32) == widened_held


def test_same_layouts_keep_one_method():
    """Shards that repack onto one layout (SmolLM2's Q4_1 q, k, v; Q5_0 / Q8_0 under
    ``gguf_repack``'s layouts, both int8 groups of 32 with fp16 scales: what the 0.5B's
    ``qkv_proj`` held before the loader mapped Q5_0 to int5, ``test_int5_layer.py``) keep one
    method and one matmul."""
    q41, q50, q80 = (_layout(TYPE[t]) for t in ("Q4_1", "Q5_0", "Q8_0"))
    assert q50 == q80
    assert isinstance(native_method([q41] * 3, "cpu"), NativeInt4LinearMethod)
    assert isinstance(native_method([q50, q50, q80], "cpu"), Int8GroupLinearMethod)
    assert type(native_method([q41, ("float", 0, False, None)], "cpu")) is LinearMethod
    with pytest.raises(ValueError, match="shards"):
        native_method([q41, q50], "cpu")  # different layouts need the shards' rows
    partial = native_method([q41, q50], "cpu", shards=[("q", 64), ("v", 32)])
    with pytest.raises(ValueError, match="shard is missing"):  # k absent from the file
        partial.create_weights(QKVLinear(K, 64, 32), torch.device("cpu"))
    layer, _ = _build("qkv-q4k-q6k", "dequant", split=True, direct=False)
    w = repack_gguf_tensor(_random_blocks(TYPE["Q4_K"], 64, K, 0), TYPE["Q4_K"], (64, K))
    with pytest.raises(ValueError, match="span shards"):  # rows [32, 96) cross q | k
        copy_repacked_rows(layer, w, 32, 96)


def test_cache_round_trip_by_buffer_name(tmp_path):
    """The quantized cache (safetensors, memory-mapped back) restores the shards' buffers by
    name (``qkv.shard_v.qweight`` ...) into a freshly created layer."""
    from localchat.engine.quant.cache import NATIVE_FORMAT, load_quantized_mmap, save_quantized

    layer, _ = _build("qkv-q4k-q6k", "dequant", split=True, direct=True)
    model = nn.Module()
    model.qkv = layer
    path = tmp_path / "entry.safetensors"
    save_quantized(model, path, {"scheme": "native", "format": NATIVE_FORMAT})
    assert "qkv.shard_v.qweight" in model.state_dict()

    fresh, _ = _build("qkv-q4k-q6k", "dequant", split=True, direct=True, seed=1)
    other = nn.Module()
    other.qkv = fresh
    loaded = []
    assert load_quantized_mmap(other, path, fmt=NATIVE_FORMAT, on_module_loaded=loaded.append)
    assert "qkv.shard_q" in loaded and "qkv.shard_v" in loaded
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh(x), layer(x))


@pytest.mark.slow
def test_qwen_1_5b_sharded_greedy_equals_widened_and_holds_fewer_bytes(cache_dir, monkeypatch):
    """Qwen2.5-Coder-1.5B (q, k Q4_K; v Q6_K in 14 of 28 layers) under ``native``, fp32, no
    cache: 24 greedy tokens through the engine (prefill, then the decode kernels) equal those of
    the widened layout (what every release before per-shard layouts held); the sharded load
    holds exactly the planner's bytes, 14 sharded ``qkv_proj`` layers' worth fewer (measured:
    1,132,392,128 against 1,171,658,432 bytes, -39.3 MB, since Q4_K and Q6_K keep their
    file's bits)."""
    import functools

    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.loader import load_model_config
    from localchat.engine.loader import native as loader
    from localchat.engine.loader.native import native_weight_bytes
    from localchat.engine.sampling_params import SamplingParams

    path = resolve_model("qwen2.5-coder-1.5b", cache_dir=cache_dir).path
    config = EngineConfig(device="cpu", dtype=torch.float32,
                          quant=QuantConfig(scheme="native", use_cache=False),
                          scheduler=SchedulerConfig(max_model_len=512))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    chat = [{"role": "user", "content": "Write a Python function that reverses a string."}]

    def run():
        engine = LLMEngine.from_path(path, config, cache_dir=cache_dir)
        model = engine.runner.model
        held = sum(t.numel() * t.element_size() for n, t in
                   list(model.named_parameters()) + list(model.named_buffers())
                   if "cos_sin_cache" not in n)
        sharded = [n for n, m in model.named_modules()
                   if isinstance(getattr(m, "quant_method", None), ShardedLinearMethod)]
        ids = engine.tokenizer.apply_chat_template(chat)
        tokens = list(engine.generate(ids, params))[-1].output_token_ids
        return tokens, held, sharded

    tokens, held, sharded = run()
    assert len(sharded) == 14 and all(n.endswith(".qkv_proj") for n in sharded)
    assert held == native_weight_bytes(path, load_model_config(path, cache_dir), "cpu",
                                       torch.float32, cache_dir)
    monkeypatch.setattr(loader, "native_method",
                        functools.partial(loader.native_method, split=False))
    old_tokens, old_held, old_sharded = run()
    print(f"held bytes: sharded {held:,}, widened {old_held:,}; tokens {tokens}")
    assert old_sharded == []
    assert tokens == old_tokens
    # per mixed layer (K = 1536): q, k (1792 rows) in Q4_K's two levels and v (256 rows) in
    # int6, as the file holds them, instead of all 2048 rows in int8 with fp32 group-16
    # scales and mins (1.5 bytes / weight)
    from localchat.engine.quant.int4 import kscale_weight_bytes
    from localchat.engine.quant.int8 import int8_grouped_weight_bytes
    from localchat.engine.quant.native_int6 import int6_weight_bytes

    widened = int8_grouped_weight_bytes(2048, 1536, 16, True, 4)
    assert old_held - held == 14 * (widened - kscale_weight_bytes(1792, 1536)
                                    - int6_weight_bytes(256, 1536))
