"""A native Q4_K layer (``NativeInt4LinearMethod`` with two-level scales: uint8 ``scales`` /
``mins`` and fp16 ``super_scales``, as the GGUF holds them) against the same layer holding the
folded fp32 scales (today's other int4 layers), built from random Q4_K blocks through the
loader's own row placement (``repack_into_rows``, the C++ repack; ``copy_repacked_rows``
otherwise).

Every compute path reads exact fp32 products of the two levels, so the outputs equal the
folded layer's bit for bit: decode rows (the W4A8 op for bf16, the exact kernel for fp32),
prefill row blocks, the embedding's gathered rows. Held bytes are 18.5 per 32 weights (the
file's 18) and equal ``weight_bytes``; where no kernel reads the two levels (PyTorch's
int4pack switch) the layer folds them at load and keeps no uint8 copy.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.layers.linear import Linear
from localchat.engine.quant import cpu_int4, native
from localchat.engine.quant.gguf_repack import dequantize_repacked, repack_gguf_tensor
from localchat.engine.quant.native import (
    NativeInt4LinearMethod,
    copy_repacked_rows,
    repack_into_rows,
)
from localchat.kernels import cpu
from tests.engine.quant.test_gguf_repack import _random_blocks

Q4_K = 12
Q4_1 = 3


def _layer(raw, n, k, scale_dtype, keep_rows=False, direct=True, ggml_type=Q4_K):
    layer = Linear(k, n)
    layer.quant_method = NativeInt4LinearMethod("cpu", keep_rows=keep_rows,
                                                scale_dtype=scale_dtype)
    layer.quant_method.create_weights(layer, "cpu")
    if not (direct and repack_into_rows(layer, raw, ggml_type, (n, k), 0, n)):
        copy_repacked_rows(layer, repack_gguf_tensor(raw, ggml_type, (n, k)), 0, n)
    layer.process_weights_after_loading()
    return layer


def _held(layer) -> int:
    return sum(t.numel() * t.element_size() for t in layer.buffers())


@pytest.fixture
def q4k():
    n, k = 80, 512  # 2.5 of the launchers' 32-row chunks; int4pack needs N % 16 == 0
    return _random_blocks(Q4_K, n, k, seed=11), n, k


@pytest.mark.parametrize("direct", [True, False])
def test_two_level_layer_equals_folded(monkeypatch, q4k, direct):
    monkeypatch.delenv("LOCALCHAT_CPU_INT4", raising=False)
    cpu_int4.own_kernels.cache_clear()
    raw, n, k = q4k
    two = _layer(raw, n, k, torch.uint8, direct=direct)
    folded = _layer(raw, n, k, torch.float32, direct=direct)
    if cpu_int4.own_kernels():
        assert two.scales.dtype == torch.uint8 and two.super_scales.shape == (n, k // 256, 2)
        assert _held(two) * 18 == n * k // 32 * 18.5 * 18  # 18.5 bytes per 32 weights
    assert _held(two) == two.quant_method.weight_bytes(n, k, torch.float32)
    w = dequantize_repacked(repack_gguf_tensor(raw, Q4_K, (n, k)))
    torch.manual_seed(0)
    for rows in (1, 5, 40):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(rows, k).to(dtype)
            got = two(x)
            assert torch.equal(got, folded(x)), (rows, dtype)
    x = torch.randn(3, k)
    assert torch.allclose(two(x), x @ w.t(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("ggml_type", [Q4_K, Q4_1])
@pytest.mark.parametrize("kernels", [True, False])
def test_embedding_rows_are_the_dequantized_rows(monkeypatch, q4k, kernels, ggml_type):
    """The C++ dequantizer's rows (where built) and the PyTorch ones both equal the gguf
    reference's, for 1-D and 2-D ids, fp32 and bf16, two-level (Q4_K) and fp16 (Q4_1)
    scales."""
    if not kernels:
        monkeypatch.setattr(native, "_cpu_kernel_rows", lambda: 0)
    _, n, k = q4k
    raw = _random_blocks(ggml_type, n, k, seed=12)
    scale_dtype = torch.uint8 if ggml_type == Q4_K else torch.float16
    emb = _layer(raw, n, k, scale_dtype, keep_rows=True, ggml_type=ggml_type)
    assert emb.scales.dtype == scale_dtype  # gathered rows fold, the layer keeps two levels
    ids = torch.tensor([3, 0, 79, 3])
    w = dequantize_repacked(repack_gguf_tensor(raw, ggml_type, (n, k)))
    assert torch.equal(emb.quant_method.embed(emb, ids, torch.float32), w[ids])
    got = emb.quant_method.embed(emb, ids.view(2, 2), torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, w[ids].view(2, 2, k).bfloat16())


def test_int4pack_switch_folds_at_load(monkeypatch, q4k):
    monkeypatch.setenv("LOCALCHAT_CPU_INT4", "int4pack")
    cpu_int4.own_kernels.cache_clear()
    try:
        raw, n, k = q4k
        layer = _layer(raw, n, k, torch.uint8)
        assert "super_scales" not in dict(layer.named_buffers())
        assert _held(layer) == layer.quant_method.weight_bytes(n, k, torch.float32)
        folded = _layer(raw, n, k, torch.float32)  # the layout Q4_K had before
        x = torch.randn(2, k)
        assert torch.equal(layer(x), folded(x))
        assert torch.equal(layer.scales_and_zeros, folded.scales_and_zeros)
    finally:
        monkeypatch.delenv("LOCALCHAT_CPU_INT4")
        cpu_int4.own_kernels.cache_clear()


@pytest.mark.skipif(not cpu.available(), reason="needs the C++ repack")
def test_direct_repack_writes_two_levels(q4k):
    raw, n, k = q4k
    a = _layer(raw, n, k, torch.uint8, direct=True)
    b = _layer(raw, n, k, torch.uint8, direct=False)
    for name in ("qweight", "scales", "mins", "super_scales"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.dtype == tb.dtype and torch.equal(ta.view(torch.uint8), tb.view(torch.uint8))
