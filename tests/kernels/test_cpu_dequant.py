"""The C++ int8 group-wise row dequantization (``localchat.kernels.cpu.int8_dequantize``, the
prefill GEMMs' weight blocks) against ``reference.dequantize_int8``.

Exactness: the kernel computes ``q * scale`` then ``+ min``, each rounded once in fp32, as the
reference does, so its fp32 output equals the reference bit for bit (compared as int32 bits,
which also tells ``-0.0`` from ``0.0``), and its bf16 output equals the reference rounded to
bf16 by PyTorch (round to nearest even) bit for bit. The scales here are random fp32 values,
whose products with q are NOT exact: a kernel that fused the product and the sum into one fma
would differ in the last bit in many elements. Every ISA path (``avx512``, ``avx2``,
``scalar``; one wider than the CPU runs clamped, so each case runs on every CPU kind) on odd
shapes: N not a multiple of the thread grain, K and G not multiples of the vector width (group
tails), G = 16 (Q6_K), 32 (Q5_x, Q8_0) and K (per channel), fp32 and fp16 scales (GGUF's
block scales, widened exactly), with and without mins.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from localchat.kernels import cpu, reference

ISAS = ["avx512", "avx2", "scalar"]
HAVE_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None

# (N, K, G): G = 16, 32 and K; K of 1 and many groups; tails of 8 / 4 / 1 weights per group;
# G = 40 (not a multiple of 16: a 16-wide and an 8-wide vector, then 8 left)
CASES = [(1, 16, 16), (7, 48, 16), (37, 96, 32), (3, 896, 32), (50, 64, 64), (5, 880, 880),
         (9, 40, 40), (4, 200, 40), (2, 7, 7), (130, 33, 33), (6, 1000, 8)]


@pytest.fixture(scope="module")
def built():
    """The extension must build wherever a C++ compiler is installed; without one the engine's
    int8 layers never call this kernel (checked here, then each test has nothing to run)."""
    ok = cpu.available()
    assert ok == HAVE_COMPILER, "a C++ compiler is present but the CPU kernels did not build"
    if not ok:
        from localchat.engine.quant import native

        assert native._cpu_kernel_rows() == 0
    return ok


def random_int8(n, k, g, with_mins, scale_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s = (torch.randn(n, k // g, generator=gen) * 0.02).to(scale_dtype)
    m = (torch.randn(n, k // g, generator=gen) * 0.1).to(scale_dtype) if with_mins else None
    return q, s, m


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("n,k,g", CASES)
def test_int8_dequantize_equals_reference(built, monkeypatch, isa, scale_dtype, with_mins,
                                          n, k, g):
    if not built:
        return
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    q, s, m = random_int8(n, k, g, with_mins, scale_dtype, seed=n * 1000 + k + g)
    ref = reference.dequantize_int8(q, s, m, g)
    out = torch.full((n, k), float("nan"))
    cpu.int8_dequantize(q, s, m, g, out)
    assert torch.equal(bits(out), bits(ref))
    out_b = torch.full((n, k), float("nan"), dtype=torch.bfloat16)
    cpu.int8_dequantize(q, s, m, g, out_b)
    assert torch.equal(bits(out_b), bits(ref.to(torch.bfloat16)))


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_rounding_ties_and_extremes(built, monkeypatch, isa):
    """Round to nearest even at exact ties (q * s with s = 1 + 2**-8 (+ a min) lands on
    bf16 halfway points), huge products rounding to inf, and subnormal results (kept, not
    flushed to zero)."""
    if not built:
        return
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    q = torch.arange(-128, 128, dtype=torch.int8).view(8, 32)
    s = torch.tensor([1 + 2.0**-8, 3 * 2.0**-9, 2.0**-135, 0.0,  # (row r: q from 32 r - 128)
                      -(1 + 2.0**-8), 1.0, 2.0**-140, 3.3e38 / 110]).view(8, 1)
    m = torch.tensor([0.0, 2.0**-9, 0.0, 0.0, 0.5, 2.0**-8, 2.0**-149, -0.0]).view(8, 1)
    for mins in (None, m):
        ref = reference.dequantize_int8(q, s, mins, 32)
        out_b = torch.empty(8, 32, dtype=torch.bfloat16)
        cpu.int8_dequantize(q, s, mins, 32, out_b)
        assert torch.equal(bits(out_b), bits(ref.to(torch.bfloat16)))
        out = torch.empty(8, 32)
        cpu.int8_dequantize(q, s, mins, 32, out)
        assert torch.equal(bits(out), bits(ref))
    assert bool(torch.isinf(out_b[7]).any()) and bool((out_b[2] != 0).all())
    assert bool((out_b[2].float().abs() < 2.0**-126).all())  # subnormal


def test_threads_do_not_change_the_result(built):
    if not built:
        return
    q, s, m = random_int8(301, 128, 16, True, torch.float16, seed=3)
    threads = torch.get_num_threads()
    outs = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            out = torch.empty(301, 128, dtype=torch.bfloat16)
            cpu.int8_dequantize(q, s, m, 16, out)
            outs.append(out)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(bits(outs[0]), bits(outs[1]))


def test_per_channel_1d_scales(built):
    if not built:
        return
    q, s, _ = random_int8(11, 96, 96, False, torch.float32, seed=4)
    out = torch.empty(11, 96)
    cpu.int8_dequantize(q, s.view(-1), None, 96, out)
    assert torch.equal(bits(out), bits(reference.dequantize_int8(q, s.view(-1))))


def test_rejects_bad_layouts(built):
    if not built:
        return
    q, s, m = random_int8(4, 64, 32, True, torch.float32, seed=5)
    out = torch.empty(4, 64)

    def call(*args, **kw):
        a = {"qweight": q, "scales": s, "mins": m, "group_size": 32, "out": out}
        a.update(kw)
        cpu.int8_dequantize(a["qweight"], a["scales"], a["mins"], a["group_size"], a["out"])

    bad = [
        ({"qweight": q.to(torch.uint8)}, "qweight must be contiguous int8"),
        ({"qweight": q.t()}, "qweight must be contiguous int8"),
        ({"group_size": 24}, "group_size 24 must divide K=64"),
        ({"group_size": 0}, "group_size 0 must divide"),
        ({"scales": s.to(torch.bfloat16)}, "scales must be contiguous fp32 or fp16"),
        ({"scales": torch.ones(4, 4)}, r"scales must be contiguous fp32 or fp16 \[4, 2\]"),
        ({"mins": m.half()}, "mins must be contiguous"),
        ({"mins": torch.zeros(2, 4)}, "mins must be contiguous"),
        ({"out": torch.empty(4, 63)}, r"out must be contiguous fp32 or bf16 \[4, 64\]"),
        ({"out": torch.empty(4, 64, dtype=torch.float16)}, "out must be contiguous fp32 or bf16"),
        ({"out": torch.empty(64, 4).t()}, "out must be contiguous"),
    ]
    for kw, msg in bad:
        with pytest.raises(RuntimeError, match=f"int8_dequantize: {msg}"):
            call(**kw)
