"""The int5 panel layout (``kernels/cpu/panel5*.cpp``, ``engine/quant/int5_panel.py``): GGUF
Q5_0 weights with 16 outputs interleaved, for the AVX2 W5A8 kernel.

- Layout: ``to_panel5`` / ``from_panel5`` are exact inverses, the C++ conversion writes
  ``to_panel5``'s bytes, one weight's bits are checked by hand, and the panel's own
  dequantization (the PyTorch one and the C++ ``int5_panel_dequantize``, fp32 and bf16, whole
  and by tile ranges) equals the row layout's reference (``gguf.quants.dequantize``'s values)
  bit for bit.
- Kernel vs ``reference.int5_matmul_a8`` on the row layout (the same activation integers and
  exact int32 dots, another fp32 summation order): within ``test_int5``'s bound
  (``4 * gamma_(K/8 + 20) * A``; the panel sums ``K / 32`` terms of exact group sums, fewer
  than the bound allows), for M from 1 past the AVX2 kernel's 6-row passes, on the AVX2 and
  portable paths, random and extreme weights (every u = 0 / 31, ``|d|`` near 2^4).
- The portable kernel equals the AVX2 one bit for bit (the same integers, the same fp32
  operations in the same order; the AVX2 kernel's int16 sums at their largest with extreme
  weights and activations); batch and thread invariance; the launchers' checks.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int5_panel import dequantize_panel5, from_panel5, to_panel5
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant
from .test_cpu_quant_a8 import built  # noqa: F401
from .test_int5 import activations, assert_a8_close, cpp_int5, q5_blocks

# 2: AVX-512 where the CPU has it (the AVX2 kernel runs there), 1: AVX2, 0: portable
LEVELS = {"avx512": 2, "avx2": 1, "scalar": 0}
SHAPES = [(16, 128), (48, 384), (80, 896), (32, 4864)]  # (N, K): 1, 3, 5 and 2 tiles


def _weights(n: int, k: int, seed: int, extreme: str | None = None):
    return cpp_int5(q5_blocks(n, k, seed=seed, extreme=extreme), n, k)


@pytest.mark.parametrize("n,k", SHAPES)
def test_layout_round_trip(built, n, k):  # noqa: F811
    w = _weights(n, k, seed=n + k)
    panel = to_panel5(*w)
    assert [t.shape for t in panel] == [(n // 16, k // 8, 64), (n // 16, k // 32, 64),
                                        (n // 16, k // 32, 16)]
    assert sum(t.nbytes for t in panel) == sum(t.nbytes for t in w)
    for a, b in zip(from_panel5(*panel), w):
        assert torch.equal(a, b)
    out = [torch.empty_like(t) for t in panel]
    cpu.int5_to_panel(*w, *out)
    for a, b in zip(out, panel):
        assert torch.equal(a, b)
    want = reference.dequantize_int5(*w)
    assert torch.equal(dequantize_panel5(*panel), want)
    # one weight by hand: output 16 t + j, column 32 g + 4 v + b (v = 5: octet 4 g + 2, high
    # nibble), its top bit bit v of the group's byte 4 j + b
    u = reference.unpack_int5(w[0], w[1])
    t, j, g, b = n // 16 - 1, 7, k // 32 - 2, 2
    col = 32 * g + 4 * 5 + b
    assert int(panel[0][t, 4 * g + 2, 4 * j + b]) >> 4 == int(u[16 * t + j, col]) & 15
    assert (int(panel[1][t, g, 4 * j + b]) >> 5) & 1 == int(u[16 * t + j, col]) >> 4
    assert float(panel[2][t, g, j]) == float(w[2][16 * t + j, g])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_dequantize_writes_the_row_layout_values(built, level, n, k):  # noqa: F811
    w = _weights(n, k, seed=2 * n + k)
    panel = to_panel5(*w)
    want = reference.dequantize_int5(*w)
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.full((n, k), float("nan"), dtype=dtype)
        cpu.int5_panel_dequantize(*panel, 0, out, isa=LEVELS[level])
        assert torch.equal(out, want.to(dtype))
        tail = torch.empty(16, k, dtype=dtype)  # the last tile alone
        cpu.int5_panel_dequantize(*panel, n - 16, tail, isa=LEVELS[level])
        assert torch.equal(tail, want[n - 16:].to(dtype))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_reference(built, level, n, k):  # noqa: F811
    w = _weights(n, k, seed=3 * n + k)
    panel = to_panel5(*w)
    for rows in (1, 2, 3, 5, 6, 7, 9, 16, 21):
        x = activations(rows, k, seed=rows)
        out = cpu.int5_panel_a8(x, *panel, isa=LEVELS[level])
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        assert_a8_close(out, x, w)
        # bf16 rows: the same integers as their fp32 widening, the result rounded once
        x16 = x.bfloat16()
        out16 = cpu.int5_panel_a8(x16, *panel, isa=LEVELS[level])
        assert out16.dtype == torch.bfloat16
        want16 = cpu.int5_panel_a8(x16.float(), *panel, isa=LEVELS[level]).bfloat16()
        assert torch.equal(out16, want16)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("extreme", ["low", "high"])
def test_extreme_weights(built, level, extreme):  # noqa: F811
    """The largest exact int32 group sums: every u = 0 (q = -16) or 31, ``|d|`` near 2^4,
    activations at +-127 after quantization; exact here, so equal to fp32 dequantized math to
    fp32 rounding."""
    n, k = 32, 896
    w = _weights(n, k, seed=2, extreme=extreme)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    out = cpu.int5_panel_a8(x, *to_panel5(*w), isa=LEVELS[level])
    assert_a8_close(out, x, w)
    assert torch.allclose(out, x @ reference.dequantize_int5(*w).t(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("isa", [2, 1])
@pytest.mark.parametrize("extreme", [None, "low", "high"])
def test_portable_equals_avx2(built, isa, extreme):  # noqa: F811
    """The AVX2 kernel (at level 1, and at level 2 where AVX-512 CPUs run it) equals the
    portable one bit for bit, random and extreme weights (the int16 sums of four `maddubs` at
    their largest: 4 * 2 * 31 * 127), fp32 and bf16 outputs, row counts across the 6-row
    passes (7 = 5 + 2, 13 = 6 + 6 + 1). Skipped where the CPU has no such level (it would
    compare the portable kernel, or the AVX2 one, with itself)."""
    if cpu.best_isa() < isa:
        pytest.skip(f"ISA level {isa} is not on this CPU")
    panel = to_panel5(*_weights(48, 768, seed=5, extreme=extreme))
    for rows in (1, 4, 6, 7, 11, 13, 19):
        for dtype in (torch.float32, torch.bfloat16):
            x = activations(rows, 768, seed=rows).to(dtype)
            if extreme:
                x = torch.where(x >= 0, 127.0, -127.0).to(dtype)
            assert torch.equal(cpu.int5_panel_a8(x, *panel, isa=isa),
                               cpu.int5_panel_a8(x, *panel, isa=0))


@pytest.mark.parametrize("level", LEVELS)
def test_batch_invariant(built, level):  # noqa: F811
    panel = to_panel5(*_weights(80, 512, seed=9))
    x = activations(20, 512, seed=2).bfloat16()
    assert_batch_invariant(lambda xs: cpu.int5_panel_a8(xs, *panel, isa=LEVELS[level]), x)


def test_rejects_bad_layouts(built):  # noqa: F811
    pl, ph, ps = to_panel5(*_weights(32, 512, seed=1))
    x = torch.randn(2, 512)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        cpu.int5_panel_a8(torch.randn(2, 500), pl, ph, ps)
    with pytest.raises(RuntimeError, match="plow must be"):
        cpu.int5_panel_a8(x, pl[:, :32], ph, ps)
    with pytest.raises(RuntimeError, match="phigh must be"):
        cpu.int5_panel_a8(x, pl, ph[:, :8], ps)
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int5_panel_a8(x, pl, ph, ps.float())
    with pytest.raises(RuntimeError, match="int5_to_panel"):
        cpu.int5_to_panel(*_weights(32, 512, seed=1), pl[:, :32], ph, ps)
    with pytest.raises(RuntimeError, match="whole 16-row tiles"):
        cpu.int5_panel_dequantize(pl, ph, ps, 8, torch.empty(16, 512))
    with pytest.raises(ValueError, match="N % 16"):
        to_panel5(*_weights(24, 512, seed=1))
