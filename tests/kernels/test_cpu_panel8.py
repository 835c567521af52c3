"""The int8 panel layout (``kernels/cpu/panel8*.cpp``, ``engine/quant/int8_panel.py``): GGUF
Q8_0 weights (int8 with an fp16 scale per 32 columns) with 16 outputs interleaved, for the
VNNI and AVX2 W8A8 kernels.

- Layout: ``to_panel8`` / ``from_panel8`` are exact inverses, the C++ conversion writes
  ``to_panel8``'s bytes, one weight is checked by hand, and the panel's own dequantization
  equals the row layout's (``dequantize_int8_grouped``) bit for bit.
- Kernel vs ``reference.int8_matmul_a8`` on the row layout (the same activation integers and
  exact int32 dots per group, another fp32 summation order): within ``test_cpu_quant_a8``'s
  summation bound, for M from 1 past the kernel's 8-row passes and 16-row blocks, K not a
  multiple of 128 (the activations' padding), on the VNNI, AVX2 and portable paths; extreme
  weights (every q = -128 or 127) against activations at +-127 are exact.
- The portable kernel equals the VNNI and AVX2 ones bit for bit; batch and thread
  invariance; the launcher's checks.
- ``int8_panel_dequantize`` (tiles back to float rows, for a prompt's GEMM) writes
  ``int8_dequantize``'s values of the row layout bit for bit, fp32 and bf16, every ISA path.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int8 import dequantize_int8_grouped
from localchat.engine.quant.int8_panel import dequantize_panel8, from_panel8, to_panel8
from localchat.kernels import cpu

from .batch_invariance import assert_batch_invariant
from .test_cpu_quant_a8 import activations, assert_summation_close, built  # noqa: F401

# 2: VNNI where the CPU has it (else AVX2), 1: AVX2 (panel8_avx2.cpp), 0: the portable kernel
LEVELS = {"avx512": 2, "avx2": 1, "scalar": 0}
SHAPES = [(16, 32), (48, 576), (80, 1536), (32, 160)]  # (N, K): SmolLM2's K; K % 128 != 0


def q8_weights(n: int, k: int, seed: int, extreme: int | None = None):
    """Random Q8_0-form weights: ``(qweight int8 [N, K], scales fp16 [N, K // 32])``; with
    ``extreme`` every q is that value."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    if extreme is not None:
        q.fill_(extreme)
    s = (torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-4).half()
    return q, s


def _check(out, x, w):
    q, s = w
    assert_summation_close(out, x, q, s.float(), None, 32)


@pytest.mark.parametrize("n,k", SHAPES)
def test_layout_round_trip(built, n, k):  # noqa: F811
    w = q8_weights(n, k, seed=n + k)
    panel = to_panel8(*w)
    assert [t.shape for t in panel] == [(n // 16, k // 4, 64), (n // 16, k // 32, 16)]
    assert sum(t.nbytes for t in panel) == sum(t.nbytes for t in w)
    for a, b in zip(from_panel8(*panel), w):
        assert torch.equal(a, b)
    out = [torch.empty_like(t) for t in panel]
    cpu.int8_to_panel(*w, *out)
    for a, b in zip(out, panel):
        assert torch.equal(a, b)
    assert torch.equal(dequantize_panel8(*panel), dequantize_int8_grouped(*w))
    t, j, c, b = n // 16 - 1, 5, k // 4 - 1, 2  # one weight by hand
    assert int(panel[0][t, c, 4 * j + b]) == int(w[0][16 * t + j, 4 * c + b])
    assert panel[1][t, c // 8, j] == w[1][16 * t + j, c // 8]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_reference(built, level, n, k):  # noqa: F811
    w = q8_weights(n, k, seed=3 * n + k)
    panel = to_panel8(*w)
    for rows in (1, 2, 3, 5, 8, 9, 16, 21):
        x = activations(rows, k, seed=rows)
        out = cpu.int8_panel_a8(x, *panel, isa=LEVELS[level])
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        _check(out, x, w)
        out16 = cpu.int8_panel_a8(x.bfloat16(), *panel, isa=LEVELS[level])
        assert out16.dtype == torch.bfloat16


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("extreme", [-128, 127])
def test_extreme_weights(built, level, extreme):  # noqa: F811
    """The largest exact int32 group dots (q = -128 or 127 against xq = +-127): the
    ``-128 * sum(xq)`` offset and the ``q + 128`` bytes stay exact, so the kernel equals
    fp32 dequantized math to fp32 rounding."""
    n, k = 32, 1536
    w = q8_weights(n, k, seed=2, extreme=extreme)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    out = cpu.int8_panel_a8(x, *to_panel8(*w), isa=LEVELS[level])
    _check(out, x, w)
    assert torch.allclose(out, x @ dequantize_int8_grouped(*w).t(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("isa", [2, 1])
@pytest.mark.parametrize("extreme", [None, -128, 127])
def test_portable_equals_vnni_and_avx2(built, isa, extreme):  # noqa: F811
    """The VNNI (2) and AVX2 (1, the sign trick: |q| = 128 read unsigned) kernels equal the
    portable one bit for bit, random and extreme weights, fp32 and bf16 outputs, row counts
    across the AVX2 kernel's 6-row passes and the VNNI one's 8-row passes."""
    panel = to_panel8(*q8_weights(48, 576, seed=5, extreme=extreme))
    for rows in (1, 4, 6, 7, 11, 13, 19):
        for dtype in (torch.float32, torch.bfloat16):
            x = activations(rows, 576, seed=rows).to(dtype)
            if extreme is not None:
                x = torch.where(x >= 0, 127.0, -127.0).to(dtype)
            assert torch.equal(cpu.int8_panel_a8(x, *panel, isa=isa),
                               cpu.int8_panel_a8(x, *panel, isa=0))


@pytest.mark.parametrize("level", LEVELS)
def test_batch_invariant(built, level):  # noqa: F811
    panel = to_panel8(*q8_weights(80, 160, seed=9))
    x = activations(20, 160, seed=2).bfloat16()  # past one 16-row block
    assert_batch_invariant(lambda xs: cpu.int8_panel_a8(xs, *panel, isa=LEVELS[level]), x)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("n,k", SHAPES)
def test_panel_dequantize_equals_row_dequantize(built, level, n, k):  # noqa: F811
    w = q8_weights(n, k, seed=n * k)
    panel = to_panel8(*w)
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        want = torch.empty(n, k, dtype=dtype)
        cpu.int8_dequantize(*w, None, 32, want, isa=0)
        for a, b in [(0, n), (0, 16), (n - 16, 16)]:
            got = torch.empty(b, k, dtype=dtype)
            cpu.int8_panel_dequantize(*panel, a, got, isa=level)
            assert torch.equal(got.view(bits), want[a:a + b].view(bits)), (dtype, a, b)


def test_rejects_bad_layouts(built):  # noqa: F811
    qp, ps = to_panel8(*q8_weights(32, 256, seed=1))
    x = torch.randn(2, 256)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        cpu.int8_panel_a8(torch.randn(2, 48), qp[:, :12], ps[:, :1])
    with pytest.raises(RuntimeError, match="qpanel must be"):
        cpu.int8_panel_a8(x, qp[:, :32], ps)
    with pytest.raises(RuntimeError, match="qpanel must be"):
        cpu.int8_panel_a8(x, qp.view(torch.uint8), ps)
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int8_panel_a8(x, qp, ps.float())
    with pytest.raises(RuntimeError, match="int8_to_panel"):
        cpu.int8_to_panel(*q8_weights(32, 256, seed=1), qp[:, :32], ps)
    with pytest.raises(RuntimeError, match="whole 16-row tiles"):
        cpu.int8_panel_dequantize(qp, ps, 8, torch.empty(16, 256))
    with pytest.raises(ValueError, match="N % 16"):
        to_panel8(*q8_weights(24, 256, seed=1))
