"""The output layer's error bound (``greedy_head.fill_bound``) filled where the weights live.

On CUDA a GGUF's first (repacking) load computes the bound from rows dequantized on the GPU;
``block_abs_sum_max`` kept its running maximum on the CPU, so every first load of a GGUF on
a GPU failed with a device mismatch (found by the first H200 run). Here a native int8 (Q8_0
layout) and int4 (Q4_0 layout) output layer is built on the device with seeded random
buffers: its bound equals ``max_n sum_k |w|`` per 32-column block, with ``w = q * s (+ m)``
dequantized by hand in float64 from the same buffers, within the rounding of fp32 sums of
32 terms (rtol 1e-5; the reduction order differs between CPU kinds). No C++ kernel
is involved (the device path dequantizes with PyTorch ops), so this also runs on a CPU,
where it checks the same maths; the CUDA case is the one the defect was about.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.layers import greedy_head
from localchat.engine.layers.linear import Linear
from localchat.engine.quant.native import native_method

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]
N, K = 300, 128  # N not a multiple of the dequantization chunk below


def _layer(layout, device: str, seed: int) -> Linear:
    layer = Linear(K, N)
    layer.quant_method = native_method([layout], device)
    layer.quant_method.create_weights(layer, device)
    gen = torch.Generator().manual_seed(seed)
    for name, buf in layer.named_buffers():
        if buf.dtype in (torch.int8, torch.uint8):
            lo, hi = (-128, 128) if buf.dtype == torch.int8 else (0, 256)
            val = torch.randint(lo, hi, buf.shape, generator=gen, dtype=torch.int32)
        else:
            val = 0.01 + 0.05 * torch.rand(buf.shape, generator=gen)
        buf.copy_(val.to(buf.dtype))
    greedy_head.add_bound_buffer(layer, device)
    return layer


@pytest.mark.parametrize("device", DEVICES)
def test_int8_bound_is_filled_on_the_weights_device(device, monkeypatch):
    layer = _layer(("int8", 32, False, torch.float16), device, seed=1)
    monkeypatch.setattr(type(layer.quant_method), "exact_cpu_rows", lambda self, l: False)
    greedy_head.fill_bound(layer)  # failed on CUDA with a device mismatch
    got = getattr(layer, greedy_head.BUFFER)
    assert got.device.type == device
    q = layer.qweight.cpu().double()
    s = layer.scales.cpu().double().repeat_interleave(32, dim=1)
    want = (q * s).abs().view(N, K // 32, 32).sum(-1).amax(0)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_int4_bound_is_filled_on_the_weights_device(device):
    layer = _layer(("int4", 32, True, torch.float16), device, seed=2)
    greedy_head.fill_bound(layer)  # the int4 layout has no dequantize_rows: embed's ids path
    got = getattr(layer, greedy_head.BUFFER)
    assert got.device.type == device
    b = layer.qweight.cpu().to(torch.int64)  # byte j: column 2 j low nibble, 2 j + 1 high
    q = torch.stack([b & 15, b >> 4], dim=-1).reshape(N, K).double()
    s = layer.scales.cpu().double().repeat_interleave(32, dim=1)
    m = layer.mins.cpu().double().repeat_interleave(32, dim=1)
    want = (q * s + m).abs().view(N, K // 32, 32).sum(-1).amax(0)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=0)
