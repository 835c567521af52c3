"""The integer-dot (W4A8 / W8A8) CPU kernels (``kernels/cpu/qa8*.cpp``) against
``reference.int4_matmul_a8`` / ``int8_matmul_a8`` (the same math in PyTorch), and that
reference against the fp32-activation references.

- Kernel vs reference: activations quantize to the same integers on every path (portable
  code, checked here), every per-block dot is an exact int32, so the only difference is the
  fp32 summation order of the ``T`` terms (sub-block dots, then group min terms, plus the
  ``xs`` sums inside the min terms): each side is within ``gamma_T * A`` of the exact sum of
  its terms, ``A`` the sum of the terms' magnitudes (Higham 3.1); checked against
  ``4 * gamma_(T+4) * A`` (the factor covers the one extra rounding of each product).
- Reference vs fp32 activations: ``|x - d * q| <= d / 2`` per element (round to nearest;
  ``d`` the block's scale), so ``|a8 - fp32| <= sum_k |w[n, k]| * d[m, b(k)] / 2`` plus both
  sides' fp32 rounding.
- Every ISA path (``avx512`` = VNNI where the CPU has it, else AVX2; ``avx2``; ``scalar``;
  for int4 also ``amx``, the AMX-INT8 tile kernel, on CPUs that have it),
  fp32 and fp16 scales/mins, M from 1 to 16, odd N, K of 1..many blocks including a trailing
  32-column half chunk, group sizes 16 (int8), 32, 64, 128 and per channel.
- Batch invariance: row i of any M-row call equals the 1-row call bit for bit; 1 thread
  equals 2.
- Dispatch: ``kernels.int4_matmul`` / ``int8_matmul`` take these kernels on CPU for up to
  ``CPU_MAX_ROWS`` rows for 16-bit activations by default (``LOCALCHAT_CPU_A8``).
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
# the int4 kernel also has the AMX-INT8 tile path (qa8_amx.cpp), asked for with its own level;
# on a CPU without AMX-INT8 that level runs the avx512 path
INT4_LEVELS = {**cpu.ISAS, "amx": cpu.AMX_INT8_LEVEL}
HAVE_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None
U = 2.0**-24


@pytest.fixture(scope="module")
def built():
    ok = cpu.available()
    assert ok == HAVE_COMPILER, "a C++ compiler is present but the CPU kernels did not build"
    if not ok:
        pytest.skip("no C++ compiler: the kernels under test are not built")  # CPU-only tool
    return ok


def int4_weights(n, k, g, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // g, generator=gen) * 0.05 + 1e-3
    m = -8 * s + torch.randn(n, k // g, generator=gen) * 0.01
    return q, s.to(dtype), m.to(dtype)


def int8_weights(n, k, g, with_mins, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s = (torch.rand(n, k // g, generator=gen) * 0.01 + 1e-4).to(dtype)
    m = (torch.randn(n, k // g, generator=gen) * 0.1).to(dtype) if with_mins else None
    return q, s, m


def activations(rows, k, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    x[:, :32] *= 10  # blocks of different magnitude
    if k >= 64:
        x[0, 32:64] = 0  # an all-zero block (d = 0)
    return x


def assert_summation_close(out, x, q, s, m, g):
    """``|out - ref| <= 4 * gamma_(T+4) * A`` (module doc). A vector path splits each
    sub-block's dot into per-lane partial dots, so ``A`` is the same sum taken over
    magnitudes: the terms of ``|x|``, ``|q|``, ``|s|``, ``|m|`` (symmetric rounding quantizes
    ``|x|`` to ``|xq|``)."""
    terms, mterms = reference._a8_terms(x, q, s, m, g)
    ref = terms.sum(-1) + (0 if mterms is None else mterms.sum(-1))
    aterms, amterms = reference._a8_terms(x.abs(), q.to(torch.int16).abs(), s.abs(),
                                          None if m is None else m.abs(), g)
    mag = aterms.double().sum(-1)
    nterms = terms.shape[-1] + 16
    if mterms is not None:
        mag = mag + amterms.double().sum(-1)
        nterms += mterms.shape[-1] + g // (16 if g == 16 else 32)
    bound = 4 * (nterms + 4) * U * mag + 1e-30
    err = (out.double() - ref.double()).abs()
    assert out.shape == ref.shape
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.3g}"


INT4_CASES = [(1, 32, 32), (7, 96, 32), (37, 160, 32), (9, 128, 64), (19, 384, 128),
              (64, 576, 32)]  # (N, K, G)
INT8_CASES = [(1, 32, 16, False), (7, 48 + 16, 16, True), (13, 96, 16, True),
              (37, 96, 32, True), (5, 160, 32, False), (11, 128, 64, True),
              (9, 384, 384, False), (6, 96, 96, True)]  # (N, K, G, mins)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("isa", INT4_LEVELS)
@pytest.mark.parametrize("n,k,g", INT4_CASES)
def test_int4_a8_matches_reference(built, isa, dtype, n, k, g):
    q, s, m = int4_weights(n, k, g, dtype, seed=n * k + g)
    for rows in (1, 2, 5, 16):
        x = activations(rows, k, seed=rows)
        out = cpu.int4_matmul_a8(x, q, s, m, g, INT4_LEVELS[isa])
        assert out.dtype == torch.float32
        assert_summation_close(out, x, reference.unpack_int4(q), s, m, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k,g,with_mins", INT8_CASES)
def test_int8_a8_matches_reference(built, isa, dtype, n, k, g, with_mins):
    q, s, m = int8_weights(n, k, g, with_mins, dtype, seed=n + k + g)
    for rows in (1, 3, 16):
        x = activations(rows, k, seed=rows + 7)
        out = cpu.int8_matmul_a8(x, q, s, m, g, cpu.ISAS[isa])
        assert_summation_close(out, x, q, s, m, g)
    if g == k and not with_mins:  # per channel, 1-D scales
        assert torch.equal(cpu.int8_matmul_a8(x, q, s[:, 0], isa=cpu.ISAS[isa]),
                           cpu.int8_matmul_a8(x, q, s, isa=cpu.ISAS[isa]))


def a8_natural(xq: torch.Tensor, k: int, int4: bool) -> torch.Tensor:
    """The kernels' activation layout (``qa8.h``) back in natural column order ``[M, k]``:
    int4 puts column ``32 b + j`` of 128-column chunk ``c`` (``b`` = block in the chunk) at
    ``128 c + 64 (j % 2) + 16 b + j // 2``; int8 keeps the natural order."""
    if not int4:
        return xq[:, :k]
    col = torch.arange(k)
    blk, j = col // 32, col % 32
    pos = (blk // 4) * 128 + (j % 2) * 64 + (blk % 4) * 16 + j // 2
    return xq[:, pos]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("int4", [True, False], ids=["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_activation_quantizer_gives_the_reference_integers(built, isa, int4, dtype):
    """Every ISA's quantizer (vectorized on AVX2 / AVX-512) gives exactly the reference's
    integers and block scales, in the kernels' layout, zero padded to a multiple of 128;
    ties (x / d = k + 1/2) round to even on every path."""
    for k in (32, 96, 160, 576, 1024):
        x = activations(5, k, seed=k).to(dtype)
        # amax 127: d = 1, so x / d lands exactly on halves (ties to even: 0.5 -> 0, 1.5 -> 2)
        x[1, :32] = torch.cat([torch.tensor([127.0]), torch.arange(31) - 15 + 0.5])
        x[2, :] = 0  # a row of zero blocks
        xq, d = cpu.a8_quantize(x, int4, cpu.ISAS[isa])
        want_q, want_d = reference.quantize_activations_int8(x.float())
        kp = -(-k // 128) * 128
        assert xq.shape == (5, kp) and d.shape == (5, kp // 32)
        assert torch.equal(a8_natural(xq, k, int4), want_q)
        assert torch.equal(d[:, :k // 32], want_d)
        assert not d[:, k // 32:].any()
        if int4:
            assert int(xq.abs().sum()) == int(want_q.abs().sum())  # padding is zero
        else:
            assert not xq[:, k:].any()


@pytest.mark.parametrize("isa", INT4_LEVELS)
def test_bf16_activations_read_in_place(built, isa):
    """bf16 rows (the CPU decode dtype) are quantized where they lie (no fp32 copy) and the
    bf16 result is the fp32 result rounded once: equal to quantizing their fp32 values."""
    q, s, m = int4_weights(37, 576, 32, torch.float16, seed=3)
    q8, s8, _ = int8_weights(37, 576, 32, False, torch.float16, seed=3)
    x = activations(5, 576, seed=9).bfloat16()
    level = INT4_LEVELS[isa]  # (the int8 op clamps the amx level to avx512)
    for got, want in ((cpu.int4_matmul_a8(x, q, s, m, 32, level),
                       cpu.int4_matmul_a8(x.float(), q, s, m, 32, level)),
                      (cpu.int8_matmul_a8(x, q8, s8, None, 32, level),
                       cpu.int8_matmul_a8(x.float(), q8, s8, None, 32, level))):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want.bfloat16())
    # a row-strided view (a slice of a wider tensor) reads the same rows
    wide = torch.cat([x, torch.zeros(5, 64, dtype=torch.bfloat16)], 1)[:, :576]
    assert torch.equal(cpu.int4_matmul_a8(wide, q, s, m, 32, level),
                       cpu.int4_matmul_a8(x, q, s, m, 32, level))


def test_activation_quantization():
    """Round half to even, clamp, zero blocks; the per-element error is at most d / 2."""
    x = torch.tensor([[127.0, 0.5, 1.5, -2.5, -127.0] + [0.0] * 27 + [0.0] * 32])
    q, d = reference.quantize_activations_int8(x)
    assert d.tolist() == [[1.0, 0.0]]
    assert q[0, :5].tolist() == [127, 0, 2, -2, -127] and not q[0, 5:].any()
    x = activations(16, 320, seed=3)
    q, d = reference.quantize_activations_int8(x)
    err = (x - q.float() * d.repeat_interleave(32, 1)).abs()
    assert bool((err <= d.repeat_interleave(32, 1) * (0.5 + 1e-6)).all())


def _rounding_bound(x, w):
    """``sum_k |w| * d / 2`` (activation rounding) + both sides' fp32 accumulation."""
    _, d = reference.quantize_activations_int8(x)
    dk = d.repeat_interleave(32, 1).double()
    k = x.shape[1]
    return (0.5 + 1e-6) * dk @ w.double().abs().t() \
        + 4 * (k + 8) * U * (x.double().abs() @ w.double().abs().t())


@pytest.mark.parametrize("n,k,g", INT4_CASES)
def test_int4_a8_reference_vs_fp32(n, k, g):
    q, s, m = int4_weights(n, k, g, torch.float32, seed=k)
    x = activations(5, k, seed=k)
    w = reference.dequantize_int4(q, s, m, g)
    err = (reference.int4_matmul_a8(x, q, s, m, g).double()
           - reference.int4_matmul(x, q, s, m, g).double()).abs()
    assert bool((err <= _rounding_bound(x, w)).all())


@pytest.mark.parametrize("n,k,g,with_mins", INT8_CASES)
def test_int8_a8_reference_vs_fp32(n, k, g, with_mins):
    q, s, m = int8_weights(n, k, g, with_mins, torch.float32, seed=k)
    x = activations(5, k, seed=k)
    w = reference.dequantize_int8(q, s, m, g)
    err = (reference.int8_matmul_a8(x, q, s, m, g).double()
           - reference.int8_matmul(x, q, s, m, g).double()).abs()
    assert bool((err <= _rounding_bound(x, w)).all())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["int4", "int8g16", "int8"])
def test_a8_batch_invariance(built, isa, op):
    """Row i of any M-row call (M = 1..16) equals the 1-row call bit for bit; one thread
    equals two."""
    n, k = 45, 224  # 224 = 3 full 64-column chunks + a 32-column half chunk
    x = activations(16, k, seed=11)
    level = cpu.ISAS[isa]
    if op == "int4":
        q, s, m = int4_weights(n, k, 32, torch.float16, seed=5)
        def call(a):
            return cpu.int4_matmul_a8(a, q, s, m, 32, level)
    else:
        g = 16 if op == "int8g16" else 32
        q, s, m = int8_weights(n, k, g, True, torch.float32, seed=5)
        def call(a):
            return cpu.int8_matmul_a8(a, q, s, m, g, level)
    assert_batch_invariant(call, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("n,k,g", [(45, 224, 32), (37, 384, 128), (16, 96, 32)])
def test_int4_amx_batch_invariance(built, dtype, n, k, g):
    """The AMX-INT8 path too: row i of any M-row call equals the 1-row call bit for bit,
    across tails of output rows (N not a multiple of its 16-row tiles), odd block counts and
    groups spanning several blocks; one thread equals two."""
    q, s, m = int4_weights(n, k, g, dtype, seed=n + k)
    x = activations(16, k, seed=12)
    assert_batch_invariant(
        lambda a: cpu.int4_matmul_a8(a, q, s, m, g, cpu.AMX_INT8_LEVEL), x)


def test_amx_path_is_distinct(built):
    """On an AMX-INT8 CPU the amx level runs the tile kernel (per-block dots summed in its
    own order: fp32 low bits differ from VNNI's on random data); elsewhere there is no tile
    kernel to tell apart."""
    if not cpu.has_amx_int8():
        pytest.skip("this CPU has no AMX-INT8")  # hardware-specific, like the VNNI check
    q, s, m = int4_weights(64, 1024, 32, torch.float32, seed=1)
    x = activations(2, 1024, seed=2)
    assert not torch.equal(cpu.int4_matmul_a8(x, q, s, m, 32, cpu.AMX_INT8_LEVEL),
                           cpu.int4_matmul_a8(x, q, s, m, 32, 2))


def test_amx_decode_switch(built, monkeypatch):
    """``LOCALCHAT_CPU_AMX_DECODE=1`` sends ``kernels.int4_matmul``'s rows (and the level
    the linear methods pass) to the AMX-INT8 kernel where the CPU has it; unset, the VNNI /
    AVX2 path; ``LOCALCHAT_CPU_AMX=0`` overrides it."""
    q, s, m = int4_weights(40, 256, 32, torch.float16, seed=6)
    x = activations(3, 256, seed=7).bfloat16()
    monkeypatch.delenv(cpu.amx.AMX_DECODE_ENV, raising=False)
    assert cpu.int4_a8_isa() == cpu.active_isa()
    assert torch.equal(kernels.int4_matmul(x, q, s, m, 32),
                       cpu.int4_matmul_a8(x, q, s, m, 32, cpu.active_isa()))
    monkeypatch.setenv(cpu.amx.AMX_DECODE_ENV, "1")
    assert cpu.amx_decode_enabled() == cpu.has_amx_int8()
    assert torch.equal(kernels.int4_matmul(x, q, s, m, 32),
                       cpu.int4_matmul_a8(x, q, s, m, 32, cpu.int4_a8_isa()))
    if cpu.has_amx_int8():
        assert cpu.int4_a8_isa() == cpu.AMX_INT8_LEVEL
    monkeypatch.setenv(cpu.amx.AMX_ENV, "0")
    assert not cpu.amx_decode_enabled() and cpu.int4_a8_isa() == cpu.active_isa()


def test_vnni_path_is_distinct(built):
    """On a VNNI CPU the ``avx512`` level runs different code from ``avx2`` (16 lanes split
    by 64-column chunks vs 8 lanes: fp32 low bits differ on random data)."""
    if not cpu.has_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI")
    q, s, m = int4_weights(64, 1024, 32, torch.float32, seed=1)
    x = activations(2, 1024, seed=2)
    assert not torch.equal(cpu.int4_matmul_a8(x, q, s, m, 32, 2),
                           cpu.int4_matmul_a8(x, q, s, m, 32, 1))


def test_dispatch(built, monkeypatch):
    """``kernels.int4_matmul`` / ``int8_matmul`` on CPU, up to ``CPU_MAX_ROWS`` rows: by
    default the integer-dot kernels for 16-bit activations and the exact fp32-activation
    kernels for fp32 ones; ``LOCALCHAT_CPU_A8=1`` the integer-dot kernels for both, ``=0``
    the exact ones for both; fp16 scales are accepted either way; more rows never."""
    q, s, m = int4_weights(40, 128, 32, torch.float16, seed=2)
    q8, s8, m8 = int8_weights(40, 128, 16, True, torch.float32, seed=2)
    x = activations(3, 128, seed=4)
    xb = x.bfloat16()

    def a8(a):
        return (torch.equal(kernels.int4_matmul(a, q, s, m, 32),
                            cpu.int4_matmul_a8(a, q, s, m, 32))
                and torch.equal(kernels.int8_matmul(a, q8, s8, m8),
                                cpu.int8_matmul_a8(a, q8, s8, m8)))

    def exact(a):
        return (torch.equal(kernels.int4_matmul(a, q, s, m, 32),
                            cpu.int4_matmul(a, q, s.float(), m.float(), 32))
                and torch.equal(kernels.int8_matmul(a, q8, s8, m8), cpu.int8_matmul(a, q8, s8, m8)))

    monkeypatch.delenv("LOCALCHAT_CPU_A8", raising=False)
    assert a8(xb) and exact(x) and not a8(x)
    assert kernels.int4_matmul(xb, q, s, m, 32).dtype == torch.bfloat16
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "1")
    assert a8(xb) and a8(x)
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")
    assert exact(xb) and exact(x)
    # rows past CPU_MAX_ROWS are prefill: never the integer-dot kernels
    xl = activations(kernels.CPU_MAX_ROWS + 1, 128, seed=5)
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "1")
    assert torch.equal(kernels.int4_matmul(xl, q, s, m, 32),
                       reference.int4_matmul(xl, q, s, m, 32))


def test_a8_rejects_bad_layouts(built):
    with pytest.raises(RuntimeError, match="group_size"):
        cpu.int4_matmul_a8(torch.randn(2, 64), torch.zeros(4, 32, dtype=torch.uint8),
                           torch.ones(4, 4), torch.ones(4, 4), 16)
    with pytest.raises(RuntimeError, match="mins"):
        cpu.int4_matmul_a8(torch.randn(2, 64), torch.zeros(4, 32, dtype=torch.uint8),
                           torch.ones(4, 2), torch.ones(4, 2).half(), 32)
    with pytest.raises(RuntimeError, match="K a multiple of 32"):
        cpu.int8_matmul_a8(torch.randn(2, 48), torch.zeros(4, 48, dtype=torch.int8),
                           torch.ones(4, 3), None, 16)
