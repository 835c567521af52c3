"""CPU int4 layers (``Int4LinearMethod``, kernel "packed") with ``LOCALCHAT_CPU_INT4_A8=1``:
up to ``CPU_MAX_ROWS`` rows go to
``localchat.kernels.int4_matmul`` over the contract layout (the integer-dot kernel where the
C++ kernels are built, batch invariant), more rows to PyTorch's int4pack copy; with
``LOCALCHAT_CPU_A8=0`` or without the opt-in (the default) int4pack serves every M and the
contract layout is not kept."""

from __future__ import annotations

import torch

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant.methods import Int4LinearMethod
from localchat.kernels import cpu


def _layer(monkeypatch, a8: str, opt_in: str = "1"):
    monkeypatch.setenv("LOCALCHAT_CPU_A8", a8)
    monkeypatch.setenv("LOCALCHAT_CPU_INT4_A8", opt_in)
    torch.manual_seed(0)
    layer = Linear(256, 96)
    layer.weight.data.normal_()
    layer.quant_method = Int4LinearMethod("cpu", 32)
    layer.quant_method.quantize_weights(layer)
    q, s, m = layer.qweight.clone(), layer.scales.clone(), layer.mins.clone()
    layer.process_weights_after_loading()
    return layer, (q, s, m)


def test_small_batches_use_the_contract_layout_kernel(monkeypatch):
    layer, (q, s, m) = _layer(monkeypatch, "1")
    x = torch.randn(kernels.CPU_MAX_ROWS + 1, 256)
    if not cpu.available():  # no compiler: int4pack for every M, as before
        assert getattr(layer, "qweight", None) is None
        return
    small = layer(x[:kernels.CPU_MAX_ROWS])
    assert torch.equal(small, kernels.int4_matmul(x[:kernels.CPU_MAX_ROWS], q, s, m, 32))
    assert torch.equal(small, torch.cat([layer(x[i:i + 1]) for i in range(len(small))]))
    packed = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.bfloat16(), layer.qweight_cpu, 32, layer.scales_and_zeros).float()
    assert torch.equal(layer(x), packed)
    held = sum(t.numel() * t.element_size() for t in layer.buffers())
    assert held == layer.quant_method.weight_bytes(96, 256, torch.float32)


import pytest


@pytest.mark.parametrize("a8,opt_in", [("0", "1"), ("1", "0")])
def test_default_or_a8_off_keeps_int4pack_only(monkeypatch, a8, opt_in):
    layer, _ = _layer(monkeypatch, a8, opt_in)
    assert getattr(layer, "qweight", None) is None
    x = torch.randn(3, 256)
    packed = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.bfloat16(), layer.qweight_cpu, 32, layer.scales_and_zeros).float()
    assert torch.equal(layer(x), packed)
    held = sum(t.numel() * t.element_size() for t in layer.buffers())
    assert held == layer.quant_method.weight_bytes(96, 256, torch.float32)
