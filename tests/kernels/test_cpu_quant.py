"""The C++ CPU quantized matmuls (``localchat.kernels.cpu``) against the PyTorch references.

- Accuracy: every ISA path (``avx512``, ``avx2``, ``scalar``; a path wider than the CPU runs
  clamped to the widest it has, so each case runs on every CPU kind) against
  ``reference.int4_matmul`` / ``int8_matmul`` on odd shapes (N not a multiple of the tiles, K
  of one or several groups, int8 groups that are not a multiple of 16 wide), M from 1 to 16.
  Bound: both sides accumulate in fp32 over K products, so each is within
  ``gamma_K = K * 2**-24`` of the exact sum relative to ``|x| @ |w|.T`` (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 3.1); the difference is checked against twice that
  (plus the dequantization's own rounding), which holds whatever the lane count or FMA use.
- Batch invariance: row i of an M-row call equals the 1-row call bit for bit, for every M in
  1..16, and one thread equals two.
- Dispatch: ``localchat.kernels.int4_matmul`` runs the C++ kernel for CPU tensors when a
  compiler built it (the dispatch result equals the kernel's), and the reference otherwise.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant

ISAS = ["avx512", "avx2", "scalar"]
HAVE_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None  # what cpu.py builds with


@pytest.fixture(autouse=True)
def exact_kernels(monkeypatch):
    """These tests are of the exact fp32-activation kernels (the integer-dot ones, the CPU
    default, are tested in test_cpu_quant_a8.py)."""
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")


@pytest.fixture(scope="module")
def built():
    """The extension must build wherever a C++ compiler is installed."""
    ok = cpu.available()
    assert ok == HAVE_COMPILER, "a C++ compiler is present but the CPU kernels did not build"
    return ok


def random_int4(n, k, g, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // g, generator=gen) * 0.05 + 1e-3
    m = -8 * s + torch.randn(n, k // g, generator=gen) * 0.01
    return q, s, m


def random_int8(n, k, g, with_mins, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, k // g, generator=gen) * 0.01 + 1e-4
    m = torch.randn(n, k // g, generator=gen) * 0.1 if with_mins else None
    return q, s, m


def assert_fp32_close(out, ref, x, w):
    """``|out - ref| <= 2 * gamma_(K+2) * (|x| @ |w|.T)`` elementwise (see module doc)."""
    k = x.shape[-1]
    absdot = x.abs().double() @ w.abs().double().t()
    bound = 2 * (k + 2) * 2.0**-24 * absdot + 1e-30
    err = (out.double() - ref.double()).abs()
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert bool((err <= bound).all()), f"max err {err.max():.3g}, bound there {bound.max():.3g}"


INT4_CASES = [(1, 32), (7, 64), (37, 96), (9, 128), (64, 384)]  # (N, K); groups follow K


def as_scales(s, m, dtype):
    """fp16 scales / mins are the GGUF Q4_0 / Q4_1 case: read in place, widened exactly."""
    return (s, m) if dtype == torch.float32 else (s.to(dtype), None if m is None else m.to(dtype))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("n,k", INT4_CASES)
def test_int4_matches_reference(built, monkeypatch, isa, scale_dtype, group_size, n, k):
    if k % group_size:
        k = group_size * 3
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    q, s, m = random_int4(n, k, group_size, seed=n * k + group_size)
    s, m = as_scales(s, m, scale_dtype)
    w = reference.dequantize_int4(q, s, m, group_size)
    for rows in (1, 2, 3, 4, 5, 8, 9, 16):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        out = kernels.int4_matmul(x, q, s, m, group_size)
        assert_fp32_close(out, reference.int4_matmul(x, q, s, m, group_size), x, w)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k,group_size,with_mins", [
    (1, 16, 16, False), (7, 48, 16, True), (37, 96, 32, True), (11, 100, 100, False),
    (5, 100, 50, True), (64, 384, 384, False), (3, 7, 7, False)])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_int8_matches_reference(built, monkeypatch, isa, n, k, group_size, with_mins,
                                scale_dtype):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    q, s, m = random_int8(n, k, group_size, with_mins, seed=n + k)
    s, m = as_scales(s, m, scale_dtype)
    w = reference.dequantize_int8(q, s, m, group_size)
    for rows in (1, 3, 16):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        out = kernels.int8_matmul(x, q, s, m)
        assert_fp32_close(out, reference.int8_matmul(x, q, s, m), x, w)
    if group_size == k:  # per channel, 1-D scales
        assert torch.equal(kernels.int8_matmul(x, q, s[:, 0]), kernels.int8_matmul(x, q, s))


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_activations_round_once(built, monkeypatch, isa):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    q, s, m = random_int4(24, 256, 32, seed=3)
    x = torch.randn(4, 256).bfloat16()
    out = kernels.int4_matmul(x, q, s, m, 32)
    assert out.dtype == torch.bfloat16
    ref = reference.int4_matmul(x, q, s, m, 32)
    # both round an fp32 result to bf16: at most one bf16 ulp apart (2**-7 relative)
    w = reference.dequantize_int4(q, s, m, 32)
    slack = 2 * 258 * 2.0**-24 * (x.float().abs() @ w.abs().t())
    assert bool(((out.float() - ref.float()).abs() <= 2.0**-7 * ref.float().abs() + slack).all())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["int4", "int8"])
def test_batch_invariance(built, monkeypatch, isa, op):
    """Row i of any M-row call (M = 1..16) equals the 1-row call bit for bit; so does the
    result on one thread against two."""
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    n, k = 45, 192
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(11))
    if op == "int4":
        q, s, m = random_int4(n, k, 64, seed=5)
        def call(a):
            return kernels.int4_matmul(a, q, s, m, 64)
    else:
        q, s, m = random_int8(n, k, 32, True, seed=5)
        def call(a):
            return kernels.int8_matmul(a, q, s, m)
    assert_batch_invariant(call, x)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["int4", "int8"])
def test_k_chunks_keep_batch_invariance(built, monkeypatch, isa, op):
    """With many rows the kernels walk K in chunks that keep the activations in L1 (and
    strips of 64 output columns): K here spans several chunks at M = 16 but one at M = 1, and
    N several strips plus a ragged tile; int8 groups of 40 have 8-column tails. Rows must
    still equal the one-row calls bit for bit, and the reference within the fp32 bound."""
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    n, k = 133, 2560
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(4)).bfloat16().float()
    if op == "int4":
        q, s, m = random_int4(n, k, 32, seed=6)
        s, m = as_scales(s, m, torch.float16)
        def call(a):
            return kernels.int4_matmul(a, q, s, m, 32)
        w = reference.dequantize_int4(q, s, m, 32)
    else:
        q, s, m = random_int8(n, k, 40, True, seed=6)
        def call(a):
            return kernels.int8_matmul(a, q, s, m)
        w = reference.dequantize_int8(q, s, m, 40)
    assert_batch_invariant(call, x)
    assert_fp32_close(call(x), x @ w.t(), x, w)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("g", [32, 48, 64, 128])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_int4_dequantize_equals_reference(built, scale_dtype, g, isa):
    """The prefill path's row-block dequantization (AVX-512 or AVX2 vector code for groups of
    a multiple of 32, else a scalar table) gives the reference's fp32 weights: bit for bit
    with fp16 scales (q * s is then exact, as for every GGUF type), within one rounding of the
    add otherwise (the kernel fuses q * s + m), and the scalar path's bits on every path; bf16
    out is the fp32 out rounded to nearest even."""
    if not built:  # then the engine's int4 layers do not take this path either
        from localchat.engine.quant import cpu_int4

        assert not cpu_int4.own_kernels()
        return
    level = cpu.ISAS[isa]
    q, s, m = random_int4(37, 384, g, seed=8)
    s, m = as_scales(s, m, scale_dtype)
    out = torch.empty(37, 384)
    cpu.int4_dequantize(q, s, m, g, out, isa=level)
    ref = reference.dequantize_int4(q, s, m, g)
    if scale_dtype == torch.float16:
        assert torch.equal(out, ref)
    else:
        assert torch.allclose(out, ref, rtol=2.0**-23, atol=1e-7)
    scalar = torch.empty(37, 384)
    cpu.int4_dequantize(q, s, m, g, scalar, isa=0)
    assert torch.equal(out, scalar)
    out16 = torch.empty(37, 384, dtype=torch.bfloat16)
    cpu.int4_dequantize(q, s, m, g, out16, isa=level)
    assert torch.equal(out16, out.bfloat16())
    with pytest.raises(RuntimeError, match="out must be"):
        cpu.int4_dequantize(q, s, m, g, torch.empty(37, 383), isa=level)


def test_isa_paths_are_distinct_code(built, monkeypatch):
    """The forced paths really differ where the CPU has them: AVX-512 sums 16 lanes, AVX2 8,
    scalar 1, so on random data their fp32 results differ in low bits (identical results
    would mean the variable was ignored)."""
    q, s, m = random_int4(64, 1024, 32, seed=1)
    x = torch.randn(2, 1024)
    outs = {}
    for isa in ISAS:
        monkeypatch.setenv(cpu.ISA_ENV, isa)
        outs[isa] = kernels.int4_matmul(x, q, s, m, 32)
    best = cpu.isa_name(cpu.best_isa())
    available = ISAS[ISAS.index(best):]
    for a in available:
        for b in available:
            if a < b:
                assert not torch.equal(outs[a], outs[b]), (a, b)


def test_unknown_isa_is_an_error(built, monkeypatch):
    """A typo in ``LOCALCHAT_CPU_ISA`` is the user's setting, not a bug: a ``SettingError``
    (a ``LocalchatError``, so the CLI prints its one line, exit 2; still a ``ValueError``)."""
    from localchat.engine.errors import LocalchatError, SettingError

    monkeypatch.setenv(cpu.ISA_ENV, "sse9")
    with pytest.raises(SettingError, match="LOCALCHAT_CPU_ISA='sse9' is not a setting") as err:
        cpu.active_isa()
    assert isinstance(err.value, LocalchatError) and isinstance(err.value, ValueError)
    assert err.value.exit_code == 2


def test_dispatch_uses_the_kernel_on_cpu(built):
    """For CPU tensors the dispatch returns exactly the C++ kernel's result when it is built
    (and the reference's when it is not), and the reference beyond ``CPU_MAX_ROWS``."""
    q, s, m = random_int4(40, 128, 32, seed=2)
    x = torch.randn(3, 128)
    expected = cpu.int4_matmul(x, q, s, m, 32) if built else reference.int4_matmul(x, q, s, m, 32)
    assert torch.equal(kernels.int4_matmul(x, q, s, m, 32), expected)
    big = torch.randn(kernels.CPU_MAX_ROWS + 1, 128)
    assert torch.equal(kernels.int4_matmul(big, q, s, m, 32),
                       reference.int4_matmul(big, q, s, m, 32))


def test_kernel_rejects_bad_layouts(built):
    with pytest.raises(RuntimeError, match="group_size"):
        cpu.int4_matmul(torch.randn(2, 64), torch.zeros(4, 32, dtype=torch.uint8),
                        torch.ones(4, 4), torch.ones(4, 4), 16)
    with pytest.raises(RuntimeError, match="int8_matmul"):
        cpu.int8_matmul(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4))
