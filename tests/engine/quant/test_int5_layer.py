"""A native Q5_0 layer in the int5 layout (``native_int5.Int5LinearMethod``), filled from random
Q5_0 blocks by the loader's own row placement (``repack_into_rows``), against gguf's
dequantization of the same blocks (the kernels themselves are tested in
``tests/kernels/test_int5.py``).

- Held bytes: 22 per 32 weights (the file's), equal to ``weight_bytes``.
- Decode rows with fp32 activations (the exact ``int5_matmul``) and prefill rows (fp32 row
  blocks): within ``2 * gamma_(K+16)`` of ``x @ w.T`` relative to ``|x| @ |w|.T``. Decode rows
  with bf16 activations (the integer-dot kernel) equal ``kernels.cpu.int5_matmul_a8`` and are
  within the activation quantization's error of ``x @ w.T``: ``sum_b (dact_b / 2) *
  sum_{k in b} |w_k|`` plus the fp32 sums' and the bf16 output's rounding. The embedding's rows
  equal the dequantized rows bit for bit.
- ``native_method`` takes int5 only where the C++ kernels read it: with
  ``LOCALCHAT_CPU_INT4=int4pack``, ``LOCALCHAT_CPU_INT5=0``, for the dequant kernel or a CUDA
  device, Q5_0 stays group-wise int8 (groups of 32, fp16 scales); the loader maps Q5_0 to int5
  only for K % 128 == 0; a fused ``qkv_proj`` with Q5_0 q, k and a Q8_0 v (Qwen2.5-Coder-0.5B)
  splits per shard and computes gguf's values where int5 is read, and stays one int8 layer
  where it is not.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from localchat.engine.layers.linear import Linear, QKVLinear
from localchat.engine.loader.native import _layout_of
from localchat.engine.quant import cpu_int4
from localchat.engine.quant.native import (
    INT5_AS_INT8,
    Int8GroupLinearMethod,
    native_method,
    repack_into_rows,
)
from localchat.engine.quant.native_int5 import Int5LinearMethod, int5_weight_bytes
from localchat.engine.quant.sharded import ShardedLinearMethod
from localchat.kernels import cpu, reference
from tests.engine.quant.test_gguf_repack import _random_blocks

Q5_0, Q8_0 = 6, 8
INT5 = ("int5", 32, False, torch.float16)
U = 2.0**-24
pytestmark = pytest.mark.skipif(not cpu.available(), reason="int5 needs the C++ kernels")


def _gguf(raw, ggml_type=Q5_0):
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type)))


@pytest.fixture
def q50():
    n, k = 40, 896
    raw = _random_blocks(Q5_0, n, k, seed=21)
    return raw, n, k, _gguf(raw)


def _layer(raw, n, k):
    layer = Linear(k, n)
    layer.quant_method = native_method([INT5], "cpu")
    assert isinstance(layer.quant_method, Int5LinearMethod)
    layer.quant_method.create_weights(layer, "cpu")
    assert repack_into_rows(layer, raw, Q5_0, (n, k), 0, n)
    layer.process_weights_after_loading()
    return layer


def test_int5_layer_holds_the_file_bytes_and_computes_the_weights(monkeypatch, q50):
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")
    from localchat import kernels

    kernels.refresh_env()
    try:
        raw, n, k, w = q50
        layer = _layer(raw, n, k)
        held = sum(t.numel() * t.element_size() for t in layer.buffers())
        assert held == int5_weight_bytes(n, k) == raw.size  # 22 bytes per 32, as the file
        assert held == layer.quant_method.weight_bytes(n, k, torch.float32)
        torch.manual_seed(0)
        for rows in (1, 5, 40):  # decode (exact fp32 kernel), verify, prefill (row blocks)
            x = torch.randn(rows, k)
            bound = 2 * (k + 16) * U * (x.abs() @ w.abs().t())
            with torch.no_grad():
                assert bool(((layer(x) - x @ w.t()).abs() <= bound).all()), rows
        ids = torch.tensor([7, 0, 39, 7])
        assert torch.equal(layer.quant_method.embed(layer, ids, torch.float32), w[ids])
    finally:
        monkeypatch.delenv("LOCALCHAT_CPU_A8")
        kernels.refresh_env()


def test_bf16_decode_rows_take_the_integer_dot_kernel(q50):
    raw, n, k, w = q50
    layer = _layer(raw, n, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(3)).bfloat16()
    with torch.no_grad():
        got = layer(x)
    assert torch.equal(got, cpu.int5_matmul_a8(x, layer.qlow, layer.qhigh, layer.scales))
    # the activation quantization's error: at most dact / 2 per activation of block b
    xf = x.float()
    _, dact = reference.quantize_activations_int8(xf)
    wb = w.abs().view(n, k // 32, 32).sum(-1)  # [N, K / 32]
    exact = xf.double() @ w.double().t()
    bound = (dact.double() / 2) @ wb.double().t() \
        + 4 * (k // 8 + 20) * U * (xf.abs().double() * 1.01 @ w.abs().double().t()) \
        + 2.0**-8 * exact.abs()  # the bf16 output's rounding
    assert bool(((got.double() - exact).abs() <= bound).all())


def test_q5_0_stays_int8_where_no_kernel_reads_int5(monkeypatch):
    def is_int8(m):
        return isinstance(m, Int8GroupLinearMethod) and (
            m.group_size, m.has_mins, m.scale_dtype) == INT5_AS_INT8[1:]

    assert is_int8(native_method([INT5], "cpu", kernel="dequant"))
    assert is_int8(native_method([INT5], "cuda"))  # no CUDA needed: decided from the device
    mixed = native_method([("int4", 32, True, torch.float16), INT5], "cpu", split=False)
    assert isinstance(mixed, Int8GroupLinearMethod) and mixed.group_size == 32
    for env, value in (("LOCALCHAT_CPU_INT4", "int4pack"), ("LOCALCHAT_CPU_INT5", "0")):
        monkeypatch.setenv(env, value)
        cpu_int4.own_kernels.cache_clear()
        try:
            assert is_int8(native_method([INT5], "cpu")), env
        finally:
            monkeypatch.delenv(env)
            cpu_int4.own_kernels.cache_clear()
    assert isinstance(native_method([INT5], "cpu"), Int5LinearMethod)
    # the 0.5B's qkv_proj (Q5_0 q, k; Q8_0 v): where int5 is not read, one int8 layer as
    # before int5 (not three equal shards); where it is, shards
    qkv = [INT5, INT5, INT5_AS_INT8]
    rows = [("q", 64), ("k", 32), ("v", 32)]
    assert is_int8(native_method(qkv, "cuda", shards=rows))
    assert is_int8(native_method(qkv, "cpu", kernel="dequant", shards=rows))
    assert isinstance(native_method(qkv, "cpu", shards=rows), ShardedLinearMethod)


def test_loader_maps_q5_0_to_int5_only_for_whole_chunks():
    t = {"type": Q5_0, "name": "blk.0.ffn_up.weight", "dims": (896, 4864)}
    assert _layout_of(t) == INT5
    assert _layout_of({**t, "dims": (96, 64)}) == INT5_AS_INT8  # K = 96: gguf_repack's layout
    assert _layout_of({**t, "type": Q8_0}) == INT5_AS_INT8  # Q8_0: the same int8 layout


def test_qwen_0_5b_style_qkv_splits_and_computes_gguf_values():
    """q (64 rows), k (32) Q5_0, v (32) Q8_0 at K = 256: int5, int5, int8 shards; decode and
    prefill rows equal per-shard F.linear over gguf's dequantization (fp32 order only)."""
    k = 256
    shards = [("q", 64, Q5_0), ("k", 32, Q5_0), ("v", 32, Q8_0)]
    layer = QKVLinear(k, 64, 32, bias=True)
    layouts = [_layout_of({"type": t, "name": "blk.0.attn_q.weight", "dims": (k, rows)})
               for _, rows, t in shards]
    method = native_method(layouts, "cpu", shards=[(s, r) for s, r, _ in shards])
    assert isinstance(method, ShardedLinearMethod)
    layer.quant_method = method
    method.create_weights(layer, torch.device("cpu"))
    kinds = [type(c.quant_method) for c in method.children(layer)]
    assert kinds == [Int5LinearMethod, Int5LinearMethod, Int8GroupLinearMethod]
    gen = torch.Generator().manual_seed(1)
    layer.bias.data.copy_(torch.randn(layer.out_features, generator=gen))
    ws = []
    for i, (sid, rows, t) in enumerate(shards):
        raw = _random_blocks(t, rows, k, seed=40 + i)
        assert repack_into_rows(layer, raw, t, (rows, k), *layer.shard_range(sid))
        ws.append(_gguf(raw, t).double())
    layer.process_weights_after_loading()
    held = sum(t.numel() * t.element_size() for t in layer.buffers())  # bias: a parameter
    assert held == 96 * k * 22 // 32 + 32 * k * 34 // 32  # the file's bytes for every shard
    w = torch.cat(ws)
    for m in (1, 40):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        with torch.no_grad():
            got = layer(x)
        want = F.linear(x.double(), w) + layer.bias.double()
        tol = 2 * (k + 16) * U * (x.abs().double() @ w.abs().t() + layer.bias.abs().double())
        assert bool(((got.double() - want).abs() <= tol + 1e-6).all()), m


@pytest.mark.slow  # the Qwen pair is for slow tests (DESIGN.md section 7)
def test_qwen_0_5b_int5_greedy_equals_int8_and_holds_the_file_bytes(cache_dir, monkeypatch):
    """Qwen2.5-Coder-0.5B (133 Q5_0 tensors) under ``native``, fp32, no cache: 24 greedy tokens
    through the engine (prefill, then the exact fp32 decode kernels) equal those with Q5_0 held
    as int8 (``LOCALCHAT_CPU_INT5=0``, what every release before int5 held); the int5 load
    holds exactly the planner's bytes, 12 bytes per 32 Q5_0 weights fewer."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.loader import load_model_config
    from localchat.engine.loader.gguf_header import read_gguf_header
    from localchat.engine.loader.native import native_weight_bytes
    from localchat.engine.sampling_params import SamplingParams

    path = resolve_model("qwen2.5-coder-0.5b", cache_dir=cache_dir).path
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
        int5 = [n for n, m in model.named_modules()
                if isinstance(getattr(m, "quant_method", None), Int5LinearMethod)]
        ids = engine.tokenizer.apply_chat_template(chat)
        tokens = list(engine.generate(ids, params))[-1].output_token_ids
        planned = native_weight_bytes(path, load_model_config(path, cache_dir), "cpu",
                                      torch.float32, cache_dir)
        return tokens, held, int5, planned

    tokens, held, int5, planned = run()
    # 85 modules: the embedding, and per layer the Q5_0 shards q, k, o_proj, gate_up_proj
    assert held == planned and len(int5) == 85
    monkeypatch.setenv("LOCALCHAT_CPU_INT5", "0")
    old_tokens, old_held, old_int5, old_planned = run()
    print(f"held bytes: int5 {held:,}, int8 {old_held:,}; tokens {tokens}")
    assert old_int5 == [] and old_held == old_planned
    assert tokens == old_tokens
    q5_weights = sum(int(np.prod(t.dims)) for t in read_gguf_header(path).tensors
                     if t.ggml_type == Q5_0)
    assert old_held - held == q5_weights * 12 // 32


def test_short_prefill_chunks_stop_sooner_for_bit_planes(q50):
    """Bit-plane layers run fp32 prefills of up to ``PLANAR_SHORT_PREFILL_ROWS`` (24) rows as
    16-row chunks of the exact row kernels (each row the one-row call's bits) and more on the
    prefill GEMM, where int4 layers chunk up to 64; both within the fp32 bound of gguf's
    values."""
    from localchat import kernels
    from localchat.engine.quant.planar import PLANAR_SHORT_PREFILL_ROWS

    raw, n, k, w = q50
    layer = _layer(raw, n, k)
    assert layer.quant_method.short_prefill_rows(layer) == PLANAR_SHORT_PREFILL_ROWS
    assert kernels.CPU_MAX_ROWS < PLANAR_SHORT_PREFILL_ROWS < kernels.SHORT_PREFILL_MAX_ROWS
    for rows in (PLANAR_SHORT_PREFILL_ROWS, PLANAR_SHORT_PREFILL_ROWS + 8):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        y = layer(x)
        one_by_one = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
        if rows <= PLANAR_SHORT_PREFILL_ROWS:
            assert torch.equal(y, one_by_one)
        else:  # the layer's own many-row path: the GEMM over the dequantized weight
            assert torch.equal(y, layer.quant_method.apply(layer, x))
        bound = 2 * (k + 16) * U * (x.abs() @ w.abs().t()) + 1e-6
        assert bool(((y - x @ w.t()).abs() <= bound).all())
