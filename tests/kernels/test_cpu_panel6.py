"""The int6 panel layout (``kernels/cpu/panel6*.cpp``, ``engine/quant/int6_panel.py``): GGUF
Q6_K weights with 16 outputs interleaved, for the VNNI W6A8 kernel.

- Layout: ``to_panel6`` / ``from_panel6`` are exact inverses, the C++ conversion writes
  ``to_panel6``'s bytes, one weight's bits are checked by hand, and the panel's own
  dequantization equals the row layout's reference (``gguf.quants.dequantize``'s values) bit
  for bit.
- Kernel vs ``reference.int6_matmul_a8`` on the row layout (the same activation integers and
  exact int32 dots, another fp32 summation order): within ``test_int6``'s bound
  (``4 * gamma_(K/8 + 20) * A``; the panel sums ``K / 32`` terms of exact group sums, fewer
  than the bound allows), for M from 1 past the kernel's 8-row passes and 16-row blocks, on
  the VNNI, AVX2 and portable paths, random and extreme weights (every u = 0 / 63, scales
  -128 / 127).
- The portable kernel equals the VNNI and AVX2 ones bit for bit (the same integers, the same
  fp32 operations in the same order); batch and thread invariance; the launcher's checks.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int6_panel import dequantize_panel6, from_panel6, to_panel6
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant
from .test_cpu_quant_a8 import built  # noqa: F401
from .test_int6 import activations, assert_a8_close, cpp_int6, q6_blocks

# 2: VNNI where the CPU has it (else AVX2), 1: AVX2 (panel6_avx2.cpp), 0: the portable kernel
LEVELS = {"avx512": 2, "avx2": 1, "scalar": 0}
SHAPES = [(16, 256), (48, 512), (80, 1536), (32, 2304)]  # (N, K): 1, 3, 5 and 2 tiles


def _weights(n: int, k: int, seed: int, extreme: str | None = None):
    return cpp_int6(q6_blocks(n, k, seed=seed, extreme=extreme), n, k)


@pytest.mark.parametrize("n,k", SHAPES)
def test_layout_round_trip(built, n, k):  # noqa: F811
    w = _weights(n, k, seed=n + k)
    panel = to_panel6(*w)
    assert [t.shape for t in panel] == [(n // 16, k // 8, 64), (n // 16, k // 16, 64),
                                        (n // 16, k // 16, 16), (n // 16, k // 256, 16)]
    assert sum(t.nbytes for t in panel) == sum(t.nbytes for t in w)
    for a, b in zip(from_panel6(*panel), w):
        assert torch.equal(a, b)
    out = [torch.empty_like(t) for t in panel]
    cpu.int6_to_panel(*w, *out)
    for a, b in zip(out, panel):
        assert torch.equal(a, b)
    assert torch.equal(dequantize_panel6(*panel), reference.dequantize_int6(*w))
    # one weight by hand: output 16 t + j, column 16 s + 12 + b = octet 2 s + 1, high nibble,
    # top bits 6-7 of the sub-block's byte 4 j + b
    u = reference.unpack_int6(w[0], w[1])
    t, j, s, b = n // 16 - 1, 5, k // 16 - 2, 3
    col = 16 * s + 12 + b
    assert int(panel[0][t, 2 * s + 1, 4 * j + b]) >> 4 == int(u[16 * t + j, col]) & 15
    assert int(panel[1][t, s, 4 * j + b]) >> 6 == int(u[16 * t + j, col]) >> 4
    assert int(panel[2][t, s, j]) == int(w[2][16 * t + j, s])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_reference(built, level, n, k):  # noqa: F811
    w = _weights(n, k, seed=3 * n + k)
    panel = to_panel6(*w)
    for rows in (1, 2, 3, 5, 8, 9, 16, 21):
        x = activations(rows, k, seed=rows)
        out = cpu.int6_panel_a8(x, *panel, isa=LEVELS[level])
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        assert_a8_close(out, x, w)
        out16 = cpu.int6_panel_a8(x.bfloat16(), *panel, isa=LEVELS[level])
        assert out16.dtype == torch.bfloat16


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("extreme", ["low", "high"])
def test_extreme_weights(built, level, extreme):  # noqa: F811
    """The largest exact int32 group sums: every u = 0 (q = -32) or 63, scales -128 / 127,
    activations at +-127 after quantization; exact here, so equal to fp32 dequantized math to
    fp32 rounding."""
    n, k = 32, 1536
    w = _weights(n, k, seed=2, extreme=extreme)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    out = cpu.int6_panel_a8(x, *to_panel6(*w), isa=LEVELS[level])
    assert_a8_close(out, x, w)
    assert torch.allclose(out, x @ reference.dequantize_int6(*w).t(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("isa", [2, 1])
@pytest.mark.parametrize("extreme", [None, "low", "high"])
def test_portable_equals_vnni_and_avx2(built, isa, extreme):  # noqa: F811
    """The VNNI (2) and AVX2 (1) kernels equal the portable one bit for bit, random and
    extreme weights (the AVX2 kernel's int16 sums at their largest), fp32 and bf16 outputs,
    row counts across the AVX2 kernel's 6-row passes and the VNNI one's 8-row passes."""
    panel = to_panel6(*_weights(48, 768, seed=5, extreme=extreme))
    for rows in (1, 4, 6, 7, 11, 13, 19):
        for dtype in (torch.float32, torch.bfloat16):
            x = activations(rows, 768, seed=rows).to(dtype)
            if extreme:
                x = torch.where(x >= 0, 127.0, -127.0).to(dtype)
            assert torch.equal(cpu.int6_panel_a8(x, *panel, isa=isa),
                               cpu.int6_panel_a8(x, *panel, isa=0))


@pytest.mark.parametrize("level", LEVELS)
def test_batch_invariant(built, level):  # noqa: F811
    panel = to_panel6(*_weights(80, 512, seed=9))
    x = activations(20, 512, seed=2).bfloat16()  # past one 16-row block
    assert_batch_invariant(lambda xs: cpu.int6_panel_a8(xs, *panel, isa=LEVELS[level]), x)


def test_rejects_bad_layouts(built):  # noqa: F811
    pl, ph, ps, pu = to_panel6(*_weights(32, 512, seed=1))
    x = torch.randn(2, 512)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        cpu.int6_panel_a8(torch.randn(2, 384), pl[:, :48], ph[:, :24], ps[:, :24], pu[:, :1])
    with pytest.raises(RuntimeError, match="plow must be"):
        cpu.int6_panel_a8(x, pl[:, :32], ph, ps, pu)
    with pytest.raises(RuntimeError, match="phigh must be"):
        cpu.int6_panel_a8(x, pl, ph[:, :16], ps, pu)
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int6_panel_a8(x, pl, ph, ps.view(torch.uint8), pu)
    with pytest.raises(RuntimeError, match="psuper must be"):
        cpu.int6_panel_a8(x, pl, ph, ps, pu.float())
    with pytest.raises(RuntimeError, match="int6_to_panel"):
        cpu.int6_to_panel(*_weights(32, 512, seed=1), pl[:, :32], ph, ps, pu)
    with pytest.raises(ValueError, match="N % 16"):
        to_panel6(*_weights(24, 512, seed=1))
