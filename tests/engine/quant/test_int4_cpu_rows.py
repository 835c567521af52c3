"""CPU int4 layers (``Int4LinearMethod``, kernel "packed"): by default, where the C++ kernels
are built, they keep the contract layout alone (one copy) and compute with localchat's kernels
(``engine/quant/cpu_int4.py``): up to ``CPU_MAX_ROWS`` rows ``localchat.kernels.int4_matmul``
(batch invariant; the exact fp32-activation kernel here, ``LOCALCHAT_CPU_A8=0``), more rows
(prefill) row blocks dequantized (to fp32, or to bf16 for bf16 activations) and multiplied.
With ``LOCALCHAT_CPU_INT4=int4pack`` (and without a compiler) they repack for PyTorch's
``_weight_int4pack_mm_for_cpu`` and drop the contract layout.

Bounds: the prefill path and the reference both sum K fp32 products, so they differ by at most
``2 * gamma_K`` relative to ``|x| @ |w|.T`` (as in ``tests/kernels/test_cpu_quant.py``)."""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant.int4_method import Int4LinearMethod
from localchat.kernels import cpu, reference


def _layer(monkeypatch, mode: str | None, k: int = 256, n: int = 96):
    if mode is None:
        monkeypatch.delenv("LOCALCHAT_CPU_INT4", raising=False)
    else:
        monkeypatch.setenv("LOCALCHAT_CPU_INT4", mode)
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")
    torch.manual_seed(0)
    layer = Linear(k, n)
    layer.weight.data.normal_()
    layer.quant_method = Int4LinearMethod("cpu", 32)
    layer.quant_method.quantize_weights(layer)
    q, s, m = layer.qweight.clone(), layer.scales.clone(), layer.mins.clone()
    layer.process_weights_after_loading()
    return layer, (q, s, m)


def _held(layer) -> int:
    return sum(t.numel() * t.element_size() for t in layer.buffers())


@pytest.mark.parametrize("mode", [None, "exact"])
def test_own_kernels_keep_one_copy_and_are_exact(monkeypatch, mode):
    layer, (q, s, m) = _layer(monkeypatch, mode)
    if not cpu.available():  # no compiler: int4pack for every M, as before
        assert getattr(layer, "qweight", None) is None
        return
    assert getattr(layer, "qweight_cpu", None) is None  # no int4pack copy beside ours
    assert _held(layer) == layer.quant_method.weight_bytes(96, 256, torch.float32)
    x = torch.randn(40, 256)
    small = layer(x[:kernels.CPU_MAX_ROWS])
    assert torch.equal(small, kernels.int4_matmul(x[:kernels.CPU_MAX_ROWS], q, s, m, 32))
    assert torch.equal(small, torch.cat([layer(x[i:i + 1]) for i in range(len(small))]))
    big = layer(x)  # prefill: fp32 row blocks
    w = reference.dequantize_int4(q, s, m, 32)
    bound = 2 * 258 * 2.0**-24 * (x.abs() @ w.abs().t())
    assert bool(((big - x @ w.t()).abs() <= bound).all())
    # bf16 activations: prefill multiplies the weights rounded once to bf16 (fp32 sums),
    # then rounds to bf16: within one bf16 rounding of that product
    xb = x.bfloat16()
    big_b = layer(xb)
    assert big_b.dtype == torch.bfloat16 and layer(xb[:3]).dtype == torch.bfloat16
    wb = w.bfloat16().float()
    ref = xb.float() @ wb.t()
    slack = 2 * 258 * 2.0**-24 * (xb.float().abs() @ wb.abs().t())
    assert bool(((big_b.float() - ref).abs() <= 2.0**-8 * ref.abs() + slack).all())


def test_prefill_blocks_cover_ragged_rows(monkeypatch):
    """N not a multiple of the row block, fp16 scales (GGUF Q4_0 / Q4_1) read in place."""
    from localchat.engine.quant import cpu_int4, cpu_prefill

    monkeypatch.setattr(cpu_prefill, "MAX_BLOCK_BYTES", 128 * 4 * 100)  # blocks of at most 100 rows (4 x 80)
    layer, (q, s, m) = _layer(monkeypatch, "exact", k=128, n=3 * 100 + 20)  # ragged
    if not cpu.available():
        return
    s16, m16 = s.half(), m.half()
    x = torch.randn(kernels.CPU_MAX_ROWS + 3, 128)
    out = cpu_int4.blockwise_int4(x, q, s16, m16, 32)
    w = reference.dequantize_int4(q, s16, m16, 32)
    bound = 2 * 130 * 2.0**-24 * (x.abs() @ w.abs().t())
    assert out.shape == (x.shape[0], q.shape[0])
    assert bool(((out - x @ w.t()).abs() <= bound).all())


def test_int4pack_switch_keeps_int4pack_only(monkeypatch):
    layer, _ = _layer(monkeypatch, "int4pack")
    assert getattr(layer, "qweight", None) is None
    x = torch.randn(3, 256)
    packed = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.bfloat16(), layer.qweight_cpu, 32, layer.scales_and_zeros).float()
    assert torch.equal(layer(x), packed)
    # bf16 rows (the decode path's single op) and a 3-D input give the same products
    xb = x.bfloat16()
    want = torch.ops.aten._weight_int4pack_mm_for_cpu(
        xb, layer.qweight_cpu, 32, layer.scales_and_zeros)
    assert torch.equal(layer(xb), want)
    assert torch.equal(layer(xb.view(1, 3, 256)), want.view(1, 3, -1))
    assert _held(layer) == layer.quant_method.weight_bytes(96, 256, torch.float32)
