"""Weight-only int8 / int4 matmuls: the references on the shared layout contract.

The references are checked against an independent construction: float weights are quantized
here by the agreed layouts (int4 asymmetric per group of K with ``w = q * scale + min``, two
values per byte, low nibble = even k; int8 group-wise with an optional ``min``, per channel when
``G = K``), the weights are rebuilt element by element in float64 from the unpacked integers, and
``reference.int4_matmul`` / ``int8_matmul`` must equal ``x @ w_dequant.T`` in float64 within an
fp32-accumulation tolerance. Kernels (Triton, CPU) are compared with these references in their
own test modules.
"""

from __future__ import annotations

import pytest
import torch

from localchat.kernels import reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def quantize_int8(w: torch.Tensor, group_size: int, asymmetric: bool):
    """``w [N, K]`` -> (``qweight [N, K]`` int8, ``scales [N, K/G]``, ``mins [N, K/G]`` or None).

    Symmetric: ``q = round(w / s)`` in -127..127. Asymmetric: ``q`` in -128..127 over
    ``[lo, hi]`` with ``w = q * s + m``."""
    n, k = w.shape
    g = w.view(n, k // group_size, group_size)
    if not asymmetric:
        scales = g.abs().amax(dim=-1).clamp(min=1e-8) / 127
        q = torch.round(g / scales[..., None]).clamp(-127, 127)
        return q.to(torch.int8).view(n, k), scales, None
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scales = ((hi - lo) / 255).clamp(min=1e-8)
    mins = lo + 128 * scales
    q = torch.round((g - mins[..., None]) / scales[..., None]).clamp(-128, 127)
    return q.to(torch.int8).view(n, k), scales, mins


def quantize_int4(w: torch.Tensor, group_size: int):
    """``w [N, K]`` -> (``qweight [N, K/2]`` uint8, ``scales, mins [N, K/G]``, ``q [N, K]``)."""
    n, k = w.shape
    g = w.view(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    mins = lo
    q = torch.round((g - mins[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.view(n, k)
    packed = torch.empty(n, k // 2, dtype=torch.uint8)
    for j in range(k // 2):  # byte j: low nibble = k = 2j, high nibble = k = 2j + 1
        packed[:, j] = q[:, 2 * j] | (q[:, 2 * j + 1] << 4)
    return packed, scales, mins, q


def dequant_by_hand(q, scales, mins, group_size):
    """float64 ``w[n, k] = q[n, k] * s[n, k // G] (+ m[n, k // G])``, column by column."""
    n, k = q.shape
    w = torch.empty(n, k, dtype=torch.float64)
    for c in range(k):
        w[:, c] = q[:, c].double() * scales[:, c // group_size].double()
        if mins is not None:
            w[:, c] += mins[:, c // group_size].double()
    return w


@pytest.mark.parametrize("group_size,asymmetric", [(16, False), (32, True), (96, False),
                                                   (96, True)])
def test_reference_int8_matmul_matches_dequantized_weights(group_size, asymmetric):
    gen = torch.Generator().manual_seed(group_size)
    w = torch.randn(40, 96, generator=gen)
    x = torch.randn(5, 96, generator=gen)
    q, s, m = quantize_int8(w, group_size, asymmetric)
    expected = x.double() @ dequant_by_hand(q, s, m, group_size).t()
    out = reference.int8_matmul(x, q, s, m, group_size)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-5)
    # group_size None reads G from the scales' shape
    torch.testing.assert_close(reference.int8_matmul(x, q, s, m), out, atol=0, rtol=0)
    # quantization error itself is small: the layout really encodes w
    torch.testing.assert_close(out, x @ w.t(), atol=0.2, rtol=0.05)


def test_reference_int8_per_channel_accepts_1d_scales():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(24, 64, generator=gen)
    x = torch.randn(3, 64, generator=gen)
    q, s, _ = quantize_int8(w, 64, asymmetric=False)  # s [N, 1]
    torch.testing.assert_close(reference.int8_matmul(x, q, s[:, 0]),
                               reference.int8_matmul(x, q, s), atol=0, rtol=0)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_reference_int4_matmul_matches_dequantized_weights(group_size):
    gen = torch.Generator().manual_seed(group_size)
    w = torch.randn(24, 256, generator=gen)
    x = torch.randn(3, 256, generator=gen)
    packed, s, m, q = quantize_int4(w, group_size)
    w_deq = dequant_by_hand(q, s, m, group_size)
    expected = x.double() @ w_deq.t()
    out = reference.int4_matmul(x, packed, s, m, group_size)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-5)
    assert (w_deq - w.double()).abs().max() <= s.max() / 2 + 1e-6  # round-to-nearest grid


def test_reference_dequantize_is_one_fp32_rounding():
    """``q * s + m`` in fp32 equals the float64 value rounded once when ``q * s`` is exact
    (GGUF's scales: 4-bit ``q`` times an fp16-derived scale), the contract's promise."""
    gen = torch.Generator().manual_seed(7)
    n, k, g = 8, 64, 32
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    s = torch.randn(n, k // g, generator=gen).half().float()
    m = torch.randn(n, k // g, generator=gen).half().float() * -8
    w = reference.dequantize_int4(packed, s, m, g)
    assert torch.equal(w, dequant_by_hand(q, s, m, g).float())


def test_reference_keeps_activation_dtype():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 64, generator=gen)
    x = torch.randn(2, 64, generator=gen).bfloat16()
    packed, s, m, _ = quantize_int4(w, 32)
    assert reference.int4_matmul(x, packed, s, m, 32).dtype == torch.bfloat16
    q8, s8, m8 = quantize_int8(w, 32, True)
    assert reference.int8_matmul(x, q8, s8, m8).dtype == torch.bfloat16


def test_reference_quant_rejects_bad_layouts():
    with pytest.raises(ValueError, match="int8_matmul"):
        reference.int8_matmul(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.uint8),
                              torch.ones(4))
    with pytest.raises(ValueError, match="int8_matmul"):  # 3 groups do not divide K = 8
        reference.int8_matmul(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8),
                              torch.ones(4, 3))
    with pytest.raises(ValueError, match="int8_matmul"):  # mins shape differs from scales
        reference.int8_matmul(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8),
                              torch.ones(4, 2), torch.ones(4, 1))
    with pytest.raises(ValueError, match="int4_matmul"):
        reference.int4_matmul(torch.randn(2, 64), torch.zeros(4, 32, dtype=torch.uint8),
                              torch.ones(4, 1), torch.ones(4, 1), group_size=32)
    with pytest.raises(ValueError, match="int4_matmul"):  # K mismatch
        reference.int4_matmul(torch.randn(2, 32), torch.zeros(4, 32, dtype=torch.uint8),
                              torch.ones(4, 2), torch.ones(4, 2), group_size=32)
