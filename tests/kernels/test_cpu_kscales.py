"""Two-level int4 scales (GGUF Q4_K as held in its file: uint8 ``scales`` / ``mins`` per 32
and fp16 ``super_scales`` ``(d, -dmin)`` per 256, ``kernels/cpu/kscales.h``) through every
int4 C++ op, against the same op on the folded fp32 scales (``reference.fold_kscales``).

The launchers widen a chunk of rows' scales into fp32 and run the unchanged kernels, and each
folded value is an exact fp32 product, so the outputs must equal the folded call's bit for bit
(``torch.equal``) on every ISA path, for M from 1 to 16 and row counts across the launchers'
32-row chunks and threads' splits; the folded calls are tested against the PyTorch
references in ``test_cpu_quant.py`` / ``test_cpu_quant_a8.py`` / ``test_cpu_dequant.py``.
Also: ``fold_kscales`` against a plain Python fold of ggml's formula, the dispatch through
``kernels.int4_matmul``, and the launchers' checks.
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant

# avx512 (VNNI where present), avx2, scalar, clamped to what the CPU has; 3 the AMX-INT8
# int4 W4A8 kernel where the CPU has it (the other ops clamp it to avx512)
ISAS = [3, 2, 1, 0]


def kscale_weights(n: int, k: int, seed: int):
    """Random int4 weights with two-level scales: 6-bit sc / m, fp16 d of both signs and
    magnitudes from 1e-4 to 1, -dmin likewise."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    sc = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    mn = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    mag = 10.0 ** (-4 * torch.rand(n, k // 256, 2, generator=gen))
    sign = torch.where(torch.rand(n, k // 256, 2, generator=gen) < 0.2, -1.0, 1.0)
    return q, sc, mn, (mag * sign).half()


def test_fold_is_ggml_formula():
    _, sc, mn, sup = kscale_weights(3, 512, seed=0)
    s, m = reference.fold_kscales(sc, mn, sup)
    assert s.dtype == m.dtype == torch.float32 and s.shape == m.shape == (3, 16)
    for n in range(3):
        for g in range(16):
            d, ndmin = float(sup[n, g // 8, 0]), float(sup[n, g // 8, 1])
            assert s[n, g].item() == d * int(sc[n, g])  # exact: 11 + 6 bits
            assert m[n, g].item() == ndmin * int(mn[n, g])
    with pytest.raises(ValueError, match="k-scales"):
        reference.fold_kscales(sc.float(), mn, sup)
    with pytest.raises(ValueError, match="k-scales"):
        reference.fold_kscales(sc, mn, sup[:, :1])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(70, 512), (5, 256), (33, 1536)])
def test_matmuls_equal_folded(built, isa, n, k):
    q, sc, mn, sup = kscale_weights(n, k, seed=n + k)
    s, m = reference.fold_kscales(sc, mn, sup)
    gen = torch.Generator().manual_seed(1)
    for rows in (1, 3, 16):
        x = torch.randn(rows, k, generator=gen)
        for xd in (torch.bfloat16, torch.float32):
            got = cpu.int4_matmul_a8(x.to(xd), q, sc, mn, 32, isa, super_scales=sup)
            assert torch.equal(got, cpu.int4_matmul_a8(x.to(xd), q, s, m, 32, isa))
        got = cpu.int4_matmul(x, q, sc, mn, 32, isa, super_scales=sup)
        assert torch.equal(got, cpu.int4_matmul(x, q, s, m, 32, isa))


@pytest.mark.parametrize("isa", ISAS)
def test_batch_invariant(built, isa):
    q, sc, mn, sup = kscale_weights(40, 768, seed=7)
    x = torch.randn(16, 768).bfloat16()
    assert_batch_invariant(
        lambda xs: cpu.int4_matmul_a8(xs, q, sc, mn, 32, isa, super_scales=sup), x)
    assert_batch_invariant(
        lambda xs: cpu.int4_matmul(xs.float(), q, sc, mn, 32, isa, super_scales=sup), x)


@pytest.mark.parametrize("isa", [2, 1, 0])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_dequantize_equals_folded(built, out_dtype, isa):
    """Two-level scales widened per chunk of rows, on every ISA path (one wider than the CPU
    runs the CPU's): the folded scales' values, the reference's bit for bit."""
    q, sc, mn, sup = kscale_weights(75, 512, seed=3)
    s, m = reference.fold_kscales(sc, mn, sup)
    got = torch.empty(75, 512, dtype=out_dtype)
    want = torch.empty(75, 512, dtype=out_dtype)
    cpu.int4_dequantize(q, sc, mn, 32, got, sup, isa=isa)
    cpu.int4_dequantize(q, s, m, 32, want, isa=isa)
    assert torch.equal(got, want)
    ref = reference.dequantize_int4(q, sc, mn, 32, super_scales=sup).to(out_dtype)
    assert torch.equal(got, ref)


def test_dispatch_reads_two_level_in_place(built):
    q, sc, mn, sup = kscale_weights(24, 512, seed=5)
    s, m = reference.fold_kscales(sc, mn, sup)
    x = torch.randn(2, 512).bfloat16()
    assert kernels.int4_a8_layout_ok(q, sc, mn, 32, sup)
    assert not kernels.int4_a8_layout_ok(q, sc, mn, 64, sup)
    got = kernels.int4_matmul(x, q, sc, mn, 32, super_scales=sup)
    assert torch.equal(got, kernels.int4_matmul(x, q, s, m, 32))
    # the W4A8 reference on the two-level form: the same integers, another fp32 summation
    # order (bounded by 1e-4 of the magnitude sum A, far above gamma_T), one bf16 rounding
    want = reference.int4_matmul_a8(x, q, sc, mn, 32, super_scales=sup).float()
    mag = x.float().abs() @ reference.dequantize_int4(q, sc, mn, 32, sup).abs().t()
    assert ((got.float() - want).abs() <= 2.0**-7 * want.abs() + 1e-4 * mag).all()


def test_bad_layouts_are_refused(built):
    q, sc, mn, sup = kscale_weights(8, 512, seed=9)
    x = torch.randn(1, 512)
    with pytest.raises(RuntimeError, match="super_scales must be contiguous fp16"):
        cpu.int4_matmul_a8(x, q, sc, mn, 32, super_scales=sup.float())
    with pytest.raises(RuntimeError, match="scales and mins must be contiguous uint8"):
        cpu.int4_matmul(x, q, sc.float(), mn, 32, super_scales=sup)
    with pytest.raises(RuntimeError, match="group_size 32"):
        cpu.int4_matmul_a8(x, q, sc[:, ::2].contiguous(), mn[:, ::2].contiguous(), 64,
                           super_scales=sup)
    with pytest.raises(RuntimeError, match="super_scales must be contiguous fp16"):
        cpu.int4_dequantize(q, sc, mn, 32, torch.empty(8, 512), sup[:4])
