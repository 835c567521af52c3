"""Weight-only int8 / int4 matmuls.

- The references against an independent construction: float weights are quantized here by
  the agreed layout (int8 symmetric per output channel; int4 asymmetric per group of K, two
  values per byte, low nibble = even k), and ``reference.int8_matmul`` / ``int4_matmul`` must
  equal ``x @ w_dequant.T`` computed from the unpacked values written by hand.

The Triton kernels are compared with these references in ``test_triton_quant.py``.
"""

from __future__ import annotations

import pytest
import torch

from localchat.kernels import reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def quantize_int8(w: torch.Tensor):
    """``w [N, K]`` float -> (``qweight [N, K]`` int8, ``scales [N]`` fp32), symmetric."""
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(w: torch.Tensor, group_size: int):
    """``w [N, K]`` -> (``qweight [N, K/2]`` uint8, ``scales, zeros [N, K/G]``, ``q [N, K]``)."""
    n, k = w.shape
    g = w.view(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    zeros = -lo / scales
    q = torch.round(g / scales[..., None] + zeros[..., None]).clamp(0, 15).to(torch.uint8)
    q = q.view(n, k)
    packed = torch.empty(n, k // 2, dtype=torch.uint8)
    for j in range(k // 2):  # byte j: low nibble = k = 2j, high nibble = k = 2j + 1
        packed[:, j] = q[:, 2 * j] | (q[:, 2 * j + 1] << 4)
    return packed, scales, zeros, q


def test_reference_int8_matmul_matches_dequantized_weights():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 96, generator=gen)
    x = torch.randn(5, 96, generator=gen)
    q, s = quantize_int8(w)
    expected = x.double() @ (q.double() * s.double()[:, None]).t()
    torch.testing.assert_close(reference.int8_matmul(x, q, s).double(), expected,
                               atol=1e-4, rtol=1e-5)
    # quantization error itself is small: the layout really encodes w
    torch.testing.assert_close(reference.int8_matmul(x, q, s), x @ w.t(), atol=0.2, rtol=0.05)


@pytest.mark.parametrize("group_size", [32, 128])
def test_reference_int4_matmul_matches_dequantized_weights(group_size):
    gen = torch.Generator().manual_seed(group_size)
    w = torch.randn(24, 256, generator=gen)
    x = torch.randn(3, 256, generator=gen)
    packed, s, z, q = quantize_int4(w, group_size)
    w_deq = torch.empty(24, 256, dtype=torch.float64)
    for k in range(256):
        w_deq[:, k] = (q[:, k].double() - z[:, k // group_size].double()) \
            * s[:, k // group_size].double()
    expected = x.double() @ w_deq.t()
    out = reference.int4_matmul(x, packed, s, z, group_size)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-5)
    assert (w_deq - w.double()).abs().max() <= s.max() / 2 + 1e-6  # round-to-nearest grid


def test_reference_quant_rejects_bad_layouts():
    with pytest.raises(ValueError, match="int8_matmul"):
        reference.int8_matmul(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.uint8),
                              torch.ones(4))
    with pytest.raises(ValueError, match="int4_matmul"):
        reference.int4_matmul(torch.randn(2, 64), torch.zeros(4, 32, dtype=torch.uint8),
                              torch.ones(4, 1), torch.ones(4, 1), group_size=32)
