"""A native Q6_K layer in the int6 layout (``native_int6.Int6LinearMethod``), filled from random
Q6_K blocks by the loader's own row placement (``repack_into_rows``), against gguf's
dequantization of the same blocks (the kernels themselves are tested in
``tests/kernels/test_int6.py``).

- Held bytes: 210 per 256 weights (the file's), equal to ``weight_bytes``.
- Decode rows with fp32 activations (the exact ``int6_matmul``) and prefill rows (fp32 row
  blocks): within ``2 * gamma_(K+16)`` of ``x @ w.T`` relative to ``|x| @ |w|.T``; decode rows
  with bf16 activations (the integer-dot kernel) equal ``kernels.cpu.int6_matmul_a8``; the
  embedding's rows equal the dequantized rows bit for bit.
- ``native_method`` takes int6 only where the C++ kernels read it: with
  ``LOCALCHAT_CPU_INT4=int4pack`` (or without a compiler, or for the dequant kernel) Q6_K
  stays group-wise int8, and a fused layer mixing Q6_K with another type splits per shard.
"""

from __future__ import annotations

import gguf
import pytest
import torch

from localchat.engine.layers.linear import Linear
from localchat.engine.quant import cpu_int4
from localchat.engine.quant.native import (
    INT6_AS_INT8,
    Int8GroupLinearMethod,
    native_method,
    repack_into_rows,
)
from localchat.engine.quant.native_int6 import Int6LinearMethod, int6_weight_bytes
from localchat.kernels import cpu
from tests.engine.quant.test_gguf_repack import _random_blocks

Q6_K = 14
INT6 = ("int6", 16, False, torch.int8)
pytestmark = pytest.mark.skipif(not cpu.available(), reason="int6 needs the C++ kernels")


@pytest.fixture
def q6k():
    n, k = 40, 512
    raw = _random_blocks(Q6_K, n, k, seed=21)
    w = torch.from_numpy(gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType.Q6_K)
                         ).reshape(n, k)
    return raw, n, k, w


def _layer(raw, n, k):
    layer = Linear(k, n)
    layer.quant_method = native_method([INT6], "cpu")
    assert isinstance(layer.quant_method, Int6LinearMethod)
    layer.quant_method.create_weights(layer, "cpu")
    assert repack_into_rows(layer, raw, Q6_K, (n, k), 0, n)
    layer.process_weights_after_loading()
    return layer


def test_int6_layer_holds_the_file_bytes_and_computes_the_weights(monkeypatch, q6k):
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")
    from localchat import kernels

    kernels.refresh_env()
    try:
        raw, n, k, w = q6k
        layer = _layer(raw, n, k)
        held = sum(t.numel() * t.element_size() for t in layer.buffers())
        assert held == int6_weight_bytes(n, k) == raw.size  # 210 bytes per 256, as the file
        assert held == layer.quant_method.weight_bytes(n, k, torch.float32)
        torch.manual_seed(0)
        for rows in (1, 5, 40):  # decode (exact fp32 kernel), verify, prefill (row blocks)
            x = torch.randn(rows, k)
            bound = 2 * (k + 16) * 2.0**-24 * (x.abs() @ w.abs().t())
            assert bool(((layer(x) - x @ w.t()).abs() <= bound).all()), rows
        ids = torch.tensor([7, 0, 39, 7])
        assert torch.equal(layer.quant_method.embed(layer, ids, torch.float32), w[ids])
    finally:
        monkeypatch.delenv("LOCALCHAT_CPU_A8")
        kernels.refresh_env()


def test_bf16_decode_rows_take_the_integer_dot_kernel(q6k):
    raw, n, k, _ = q6k
    layer = _layer(raw, n, k)
    x = torch.randn(3, k).bfloat16()
    want = cpu.int6_matmul_a8(x, layer.qlow, layer.qhigh, layer.scales, layer.super_scales)
    assert torch.equal(layer(x), want)


def test_q6_k_stays_int8_where_no_kernel_reads_int6(monkeypatch):
    assert isinstance(native_method([INT6], "cpu", kernel="dequant"), Int8GroupLinearMethod)
    mixed = native_method([("int4", 32, True, torch.uint8), INT6], "cpu", split=False)
    assert isinstance(mixed, Int8GroupLinearMethod) and mixed.group_size == 16
    monkeypatch.setenv("LOCALCHAT_CPU_INT4", "int4pack")
    cpu_int4.own_kernels.cache_clear()
    try:
        m = native_method([INT6], "cpu")
        assert isinstance(m, Int8GroupLinearMethod)
        assert (m.group_size, m.has_mins, m.scale_dtype) == INT6_AS_INT8[1:]
    finally:
        monkeypatch.delenv("LOCALCHAT_CPU_INT4")
        cpu_int4.own_kernels.cache_clear()
