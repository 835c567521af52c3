"""The int4 panel layout (``kernels/cpu/panel4*.cpp``, ``engine/quant/int4_panel.py``):
int4 weights with 16 outputs interleaved, for the VNNI W4A8 kernel; two-level scales (GGUF
Q4_K) and fp16 ones (Q4_0 / Q4_1, K a multiple of 32 only).

- Layout: ``to_panel`` / ``from_panel`` are exact inverses, and the C++ conversion writes
  ``to_panel``'s bytes.
- Kernel vs ``reference.int4_matmul_a8`` on the row layout (the same activation integers and
  exact int32 dots per 32-column group, another fp32 summation order): within
  ``test_cpu_quant_a8``'s summation bound (``4 * gamma_(T+4) * A``, Higham 3.1), for M from 1
  past the kernel's 16-row blocks, on the VNNI, AVX2 and portable paths.
- The portable kernel equals the VNNI and AVX2 ones bit for bit (the same operations in the
  same order); batch and thread invariance on each; the launcher's checks.
- ``int4_panel_dequantize`` (a one-level panel's tiles back to float rows, for a prompt's
  GEMM) writes ``int4_dequantize``'s values of the row layout bit for bit, fp32 and bf16, on
  every ISA path, for whole weights and 16-row blocks; it refuses a block off the tiles.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int4_panel import from_panel, to_panel
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant
from .test_cpu_kscales import kscale_weights
from .test_cpu_quant_a8 import activations, assert_summation_close, built  # noqa: F401

# 2: VNNI where the CPU has it (else AVX2), 1: AVX2 (panel4_avx2.cpp), 0: the portable kernel
LEVELS = {"avx512": 2, "avx2": 1, "scalar": 0}
SHAPES = [(16, 256), (48, 512), (80, 1536), (32, 2304)]  # (N, K): 1, 3, 5 and 2 tiles
ONE_LEVEL_SHAPES = [(16, 32), (48, 576), (32, 160)]  # SmolLM2's K, K % 128 != 0


def one_level_weights(n: int, k: int, seed: int):
    """Random int4 weights with fp16 scales and mins per 32 columns (Q4_1's form)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s = (torch.rand(n, k // 32, generator=gen) * 0.05 + 1e-3).half()
    m = (-8 * s.float() + torch.randn(n, k // 32, generator=gen) * 0.01).half()
    return q, s, m


@pytest.mark.parametrize("n,k", SHAPES)
def test_layout_round_trip(built, n, k):  # noqa: F811
    w = kscale_weights(n, k, seed=n + k)
    panel = to_panel(*w)
    assert [t.shape for t in panel] == [(n // 16, k // 8, 64), (n // 16, k // 32, 16),
                                        (n // 16, k // 32, 16), (n // 16, k // 256, 2, 16)]
    for a, b in zip(from_panel(*panel), w):
        assert torch.equal(a, b)
    out = [torch.empty_like(t) for t in panel]
    cpu.int4_to_panel(*w, *out)
    for a, b in zip(out, panel):
        assert torch.equal(a, b)
    one = one_level_weights(n, k, seed=n)
    panel1 = to_panel(*one)
    assert panel1[3] is None and panel1[1].dtype == torch.float16
    for a, b in zip(from_panel(*panel1), (*one, None)):
        assert a is b is None or torch.equal(a, b)
    out1 = [torch.empty_like(t) for t in panel1[:3]]
    cpu.int4_to_panel(*one, None, *out1, None)
    for a, b in zip(out1, panel1):
        assert torch.equal(a, b)
    # one weight spot-checked by hand: output 16 t + j, column 8 o + 4 + b = high nibble
    q = reference.unpack_int4(w[0])
    t, j, o, b = n // 16 - 1, 5, k // 8 - 2, 3
    assert int(panel[0][t, o, 4 * j + b]) >> 4 == int(q[16 * t + j, 8 * o + 4 + b])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_reference(built, level, n, k):  # noqa: F811
    q, sc, mn, sup = kscale_weights(n, k, seed=3 * n + k)
    s, m = reference.fold_kscales(sc, mn, sup)
    panel = to_panel(q, sc, mn, sup)
    for rows in (1, 2, 3, 5, 16, 21):
        x = activations(rows, k, seed=rows)
        out = cpu.int4_panel_a8(x, *panel, isa=LEVELS[level])
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        assert_summation_close(out, x, reference.unpack_int4(q), s, m, 32)
        out16 = cpu.int4_panel_a8(x.bfloat16(), *panel, isa=LEVELS[level])
        assert out16.dtype == torch.bfloat16


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n,k", ONE_LEVEL_SHAPES)
def test_one_level_matches_reference(built, level, n, k):  # noqa: F811
    q, s, m = one_level_weights(n, k, seed=n + k)
    panel = to_panel(q, s, m)
    for rows in (1, 3, 16, 21):
        x = activations(rows, k, seed=rows)
        out = cpu.int4_panel_a8(x, *panel, isa=LEVELS[level])
        assert_summation_close(out, x, reference.unpack_int4(q), s.float(), m.float(), 32)
    x = activations(20, k, seed=3).bfloat16()
    assert_batch_invariant(lambda xs: cpu.int4_panel_a8(xs, *panel, isa=LEVELS[level]), x)


@pytest.mark.parametrize("isa", [2, 1])
def test_portable_equals_vnni_and_avx2(built, isa):  # noqa: F811
    """The VNNI (2) and AVX2 (1) kernels equal the portable one bit for bit: row counts
    across the AVX2 kernel's passes of up to 6 rows and the VNNI one's 16-row blocks, fp32
    and bf16 outputs."""
    panel = to_panel(*kscale_weights(48, 768, seed=5))
    one = to_panel(*one_level_weights(48, 576, seed=5))
    for rows in (1, 4, 6, 7, 13, 19):
        for dtype in (torch.float32, torch.bfloat16):
            x = activations(rows, 768, seed=rows).to(dtype)
            assert torch.equal(cpu.int4_panel_a8(x, *panel, isa=isa),
                               cpu.int4_panel_a8(x, *panel, isa=0))
            x = activations(rows, 576, seed=rows).to(dtype)
            assert torch.equal(cpu.int4_panel_a8(x, *one, isa=isa),
                               cpu.int4_panel_a8(x, *one, isa=0))


@pytest.mark.parametrize("level", LEVELS)
def test_batch_invariant(built, level):  # noqa: F811
    panel = to_panel(*kscale_weights(80, 512, seed=9))
    x = activations(20, 512, seed=2).bfloat16()  # past one 16-row block
    assert_batch_invariant(lambda xs: cpu.int4_panel_a8(xs, *panel, isa=LEVELS[level]), x)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("n,k", ONE_LEVEL_SHAPES)
def test_panel_dequantize_equals_row_dequantize(built, level, n, k):  # noqa: F811
    q, s, m = one_level_weights(n, k, seed=n * k)
    qp, ps, pm, _ = to_panel(q, s, m)
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        want = torch.empty(n, k, dtype=dtype)
        cpu.int4_dequantize(q, s, m, 32, want, isa=0)
        for a, b in [(0, n), (0, 16), (n - 16, 16)]:
            got = torch.empty(b, k, dtype=dtype)
            cpu.int4_panel_dequantize(qp, ps, pm, a, got, isa=level)
            assert torch.equal(got.view(bits), want[a:a + b].view(bits)), (dtype, a, b)


def test_panel_dequantize_rejects_blocks_off_the_tiles(built):  # noqa: F811
    qp, ps, pm, _ = to_panel(*one_level_weights(48, 64, seed=2))
    for a, b in ((8, 16), (0, 20), (32, 32)):
        with pytest.raises(RuntimeError, match="whole 16-row tiles"):
            cpu.int4_panel_dequantize(qp, ps, pm, a, torch.empty(b, 64))
    with pytest.raises(RuntimeError, match="pscales / pmins"):
        cpu.int4_panel_dequantize(qp, ps.float(), pm, 0, torch.empty(48, 64))


def test_rejects_bad_layouts(built):  # noqa: F811
    qp, ps, pm, pu = to_panel(*kscale_weights(32, 512, seed=1))
    x = torch.randn(2, 512)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        cpu.int4_panel_a8(torch.randn(2, 384), qp[:, :48], ps[:, :12], pm[:, :12], pu[:, :1])
    with pytest.raises(RuntimeError, match="qpanel must be"):
        cpu.int4_panel_a8(x, qp[:, :32], ps, pm, pu)
    with pytest.raises(RuntimeError, match="pscales / pmins"):
        cpu.int4_panel_a8(x, qp, ps.float(), pm, pu)
    with pytest.raises(RuntimeError, match="psuper must be"):
        cpu.int4_panel_a8(x, qp, ps, pm, pu.float())
    with pytest.raises(RuntimeError, match="without psuper"):  # uint8 scales need psuper
        cpu.int4_panel_a8(x, qp, ps, pm, None)
    with pytest.raises(ValueError, match="N % 16"):
        to_panel(*kscale_weights(24, 512, seed=1))
