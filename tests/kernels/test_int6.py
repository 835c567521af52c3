"""The int6 layout (GGUF Q6_K held exactly, ``kernels/cpu/qa6.h``): the numpy and C++ repacks,
the dequantization, the integer-dot matmul ``int6_matmul_a8`` and the exact fp32-activation
``int6_matmul``, against ``gguf.quants.dequantize`` and ``reference.*int6*``.

- Repack / dequantize: random valid Q6_K blocks (random bytes, fp16 ``d`` finite of both signs
  from subnormal-adjacent to large) and a real Q6_K tensor of Qwen2.5-Coder-0.5B (``-m slow``,
  skipped when the model is not downloaded): the numpy
  repack, the C++ repack (equal to it byte for byte, with and without a row permutation, over
  two threads' chunks), then the reference and every ISA's dequantization equal to
  ``gguf.quants.dequantize`` bit for bit in fp32, and that rounded to nearest even in bf16.
- ``int6_matmul_a8`` vs ``reference.int6_matmul_a8``: the activations quantize to the same
  integers on every path and every lane dot is an exact int32, so the two differ only in the
  fp32 summation order of their terms (the reference sums ``T = K / 16`` sub-block terms, the
  kernels ``K / 8`` lane terms then a reduction): each is within ``gamma_T * A`` of the exact
  sum (Higham 3.1), ``A`` the sum of the terms' magnitudes; checked against
  ``4 * gamma_(K/8 + 20) * A`` (the factor covers the two roundings of each term's scale).
- ``int6_matmul`` vs ``reference.int6_matmul`` (fp32 activations, the same exact weights):
  each side within ``gamma_K * sum_k |x| |w|`` of the exact dot: ``2 * gamma_(K+16)`` of it.
- Every ISA path (``avx512`` = VNNI for the integer dot where the CPU has it, else AVX2;
  ``avx2``; ``scalar``; a level the CPU lacks is clamped, as in the other kernel tests),
  M = 1..16, N in (1, 3, 5, 17), K in (256, 512, 1536), extreme weights (all u = 0 / 63,
  scales -128 / 127); batch and thread invariance bit for bit; the launchers' checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.engine.quant.int6_layout import pack_int6, q6_k_values, repack_q6_k
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant

gguf = pytest.importorskip("gguf")

ISAS = ["avx512", "avx2", "scalar"]
U = 2.0**-24
SHAPES = [(n, k) for n in (1, 3, 5, 17) for k in (256, 512, 1536)]
MODELS = Path.home() / ".cache" / "localchat" / "models"


def q6_blocks(n: int, k: int, seed: int, extreme: str | None = None) -> np.ndarray:
    """``[n, k // 256 * 210]`` uint8 Q6_K rows: random bytes, finite fp16 ``d`` of both signs;
    ``extreme`` = "low" / "high": every u = 0 / 63 and sub-block scales -128 / 127."""
    rng = np.random.default_rng(seed)
    nb = n * k // 256
    raw = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
    mag = np.exp2(rng.uniform(-14, 4, nb)) * rng.choice([-1.0, 1.0], nb)
    raw[:, 208:210] = mag.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if extreme:
        raw[:, 0:192] = 0 if extreme == "low" else 0xFF
        raw[:, 192:208] = np.array(-128 if extreme == "low" else 127, np.int8).view(np.uint8)
    return raw.reshape(n, -1)


def gguf_values(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K))


def numpy_int6(raw: np.ndarray, n: int, k: int, rows=None) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(a) for a in repack_q6_k(raw, n, k, rows))


def cpp_int6(raw: np.ndarray, n: int, k: int, rows=None) -> tuple[torch.Tensor, ...]:
    t = (torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // 4, dtype=torch.uint8),
         torch.empty(n, k // 16, dtype=torch.int8), torch.empty(n, k // 256, dtype=torch.float16))
    cpu.gguf_repack_q6(torch.from_numpy(np.ascontiguousarray(raw).reshape(-1)), *t,
                       None if rows is None else torch.as_tensor(rows, dtype=torch.int64))
    return t


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    x[:, :32] *= 10  # blocks of different magnitude
    x[0, 32:64] = 0  # an all-zero block (d = 0)
    return x


# --- layout and repack ------------------------------------------------------------------


def test_pack_int6_follows_the_documented_bits():
    """qlow / qhigh bit by bit as the layout's docstring states, by explicit loops."""
    rng = np.random.default_rng(0)
    u = rng.integers(0, 64, size=(3, 256), dtype=np.uint8)
    qlow, qhigh = pack_int6(u)
    assert qlow.shape == (3, 128) and qhigh.shape == (3, 64)
    for n in range(3):
        for c in range(2):
            for i in range(64):
                assert qlow[n, 64 * c + i] == (u[n, 128 * c + 2 * i] & 15) | (
                    (u[n, 128 * c + 2 * i + 1] & 15) << 4)
            for j in range(32):
                col = 128 * c
                want = ((u[n, col + 2 * j] >> 4) | ((u[n, col + 2 * (j + 32)] >> 4) << 2)
                        | ((u[n, col + 2 * j + 1] >> 4) << 4)
                        | ((u[n, col + 2 * (j + 32) + 1] >> 4) << 6))
                assert qhigh[n, 32 * c + j] == want
    assert torch.equal(reference.unpack_int6(torch.from_numpy(qlow), torch.from_numpy(qhigh)),
                       torch.from_numpy(u))


@pytest.mark.parametrize("n,k", [(1, 256), (3, 512), (17, 1536)])
def test_numpy_repack_dequantizes_like_gguf(n, k):
    raw = q6_blocks(n, k, seed=n + k)
    ql, qh, sc, d = numpy_int6(raw, n, k)
    assert (ql.dtype, qh.dtype, sc.dtype, d.dtype) == (torch.uint8, torch.uint8, torch.int8,
                                                      torch.float16)
    assert (ql.shape, qh.shape, sc.shape, d.shape) == ((n, k // 2), (n, k // 4), (n, k // 16),
                                                      (n, k // 256))
    got = reference.dequantize_int6(ql, qh, sc, d)
    assert got.dtype == torch.float32 and torch.equal(got, gguf_values(raw))
    # the values themselves: u - 32 are gguf's integers
    u = q6_k_values(raw.reshape(-1, 210)).reshape(n, k)
    assert torch.equal(reference.unpack_int6(ql, qh), torch.from_numpy(u))


def test_numpy_repack_rows_and_errors():
    raw = q6_blocks(4, 512, seed=1)
    rows = np.array([2, 0, 3, 1, 1])
    got = numpy_int6(raw, 5, 512, rows)
    want = numpy_int6(raw[rows], 5, 512)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="multiple of 256"):
        repack_q6_k(raw, 4, 384)
    with pytest.raises(ValueError, match="hold 4 rows"):
        repack_q6_k(raw, 3, 512)
    with pytest.raises(ValueError, match="whole rows"):
        repack_q6_k(raw.reshape(-1)[:-1], 4, 512)


@pytest.mark.parametrize("n,k", [(1, 256), (7, 512), (17, 1536), (1300, 256)])
def test_cpp_repack_equals_numpy(built, n, k):
    """Byte for byte (fp16 super scales as bits); 1300 rows of 210 bytes span two threads'
    chunks."""
    raw = q6_blocks(n, k, seed=n * k)
    got, want = cpp_int6(raw, n, k), numpy_int6(raw, n, k)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    rows = np.random.default_rng(n).integers(0, n, size=n + 2)  # a permutation with repeats
    got = cpp_int6(raw, n + 2, k, rows)
    want = numpy_int6(raw, n + 2, k, rows)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(got, want))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 256), (5, 512), (17, 1536), (40, 2560)])
def test_dequantize_matches_gguf(built, isa, n, k):
    raw = q6_blocks(n, k, seed=3 * n + k)
    w = cpp_int6(raw, n, k)
    want = gguf_values(raw)
    out = torch.full((n, k), float("nan"))
    cpu.int6_dequantize(*w, out, cpu.ISAS[isa])
    assert torch.equal(out, want)
    outb = torch.zeros(n, k, dtype=torch.bfloat16)
    cpu.int6_dequantize(*w, outb, cpu.ISAS[isa])
    assert torch.equal(outb, want.bfloat16())
    assert torch.equal(reference.dequantize_int6(*w), want)


def _real_q6_k_tensor():
    path = MODELS / "qwen2.5-coder-0.5b" / "Qwen2.5-Coder-0.5B-Instruct.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not downloaded")
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_down.weight":
            assert t.tensor_type == gguf.GGMLQuantizationType.Q6_K
            k, n = (int(s) for s in t.shape)
            return np.array(t.data).reshape(n, -1), n, k
    pytest.fail("blk.0.ffn_down.weight not in the 0.5B file")


@pytest.mark.slow  # the Qwen pair is for slow tests (DESIGN.md section 7); ~15 s on 2 cores
def test_real_q6_k_tensor(built):
    """Qwen2.5-Coder-0.5B's blk.0.ffn_down (896 x 4864, Q6_K): both repacks agree, the
    dequantization (numpy reference, every ISA) is gguf's bit for bit, and the integer-dot
    matmul is within its bound of the reference."""
    raw, n, k = _real_q6_k_tensor()
    want = gguf_values(raw)
    w = cpp_int6(raw, n, k)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(w, numpy_int6(raw, n, k)))
    assert torch.equal(reference.dequantize_int6(*w), want)
    for isa in ISAS:
        out = torch.empty(n, k)
        cpu.int6_dequantize(*w, out, cpu.ISAS[isa])
        assert torch.equal(out, want), isa
    x = activations(3, k, seed=5)
    assert_a8_close(cpu.int6_matmul_a8(x, *w), x, w)


# --- matmuls ------------------------------------------------------------------------------


def assert_a8_close(out, x, w):
    """``|out - ref| <= 4 * gamma_(K/8 + 20) * A`` (module doc), ``A`` the terms of
    ``|xq|``, ``|u - 32|``, ``|d * sc|``, ``d_act``."""
    ql, qh, sc, d = w
    ref = reference.int6_matmul_a8(x.float(), *w)
    xq, da = reference.quantize_activations_int8(x.float())
    m, k = x.shape
    n = ql.shape[0]
    q = (reference.unpack_int6(ql, qh).double() - 32).abs()
    dots = torch.einsum("mjs,njs->mnj", xq.double().abs().view(m, k // 16, 16),
                        q.view(n, k // 16, 16))
    sd = reference.int6_scales(sc, d).double().abs()[None] \
        * da.double().repeat_interleave(2, 1)[:, None]
    mag = (dots * sd).sum(-1)
    bound = 4 * (k // 8 + 20) * U * mag + 1e-30
    err = (out.double() - ref.double()).abs()
    assert out.shape == ref.shape == (m, n)
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_int6_a8_matches_reference(built, isa, n, k):
    w = cpp_int6(q6_blocks(n, k, seed=n + 7 * k), n, k)
    x = activations(16, k, seed=n + k)
    for rows in range(1, 17):
        out = cpu.int6_matmul_a8(x[:rows], *w, isa=cpu.ISAS[isa])
        assert out.dtype == torch.float32
        assert_a8_close(out, x[:rows], w)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("extreme", ["low", "high"])
def test_int6_a8_extreme_weights(built, isa, extreme):
    """u = 0 everywhere (q = -32: the dot is all offset) or 63, scales -128 / 127, activations
    at +-127 after quantization: the largest int32 dots and int16 pair sums."""
    n, k = 5, 1536
    w = cpp_int6(q6_blocks(n, k, seed=2, extreme=extreme), n, k)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    out = cpu.int6_matmul_a8(x, *w, isa=cpu.ISAS[isa])
    assert_a8_close(out, x, w)
    # exact here: every term is +-(32 or 31) * 127 * 16 * d * sc * (1/127) per sub-block
    want = x @ reference.dequantize_int6(*w).t()
    assert torch.allclose(out, want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_int6_fp32_matches_reference(built, isa, n, k):
    w = cpp_int6(q6_blocks(n, k, seed=n + 11 * k), n, k)
    wf = reference.dequantize_int6(*w)
    x = activations(16, k, seed=2 * n + k)
    for rows in range(1, 17):
        xr = x[:rows]
        out = cpu.int6_matmul(xr, *w, isa=cpu.ISAS[isa])
        ref = reference.int6_matmul(xr, *w)
        bound = 2 * (k + 16) * U * (xr.double().abs() @ wf.double().abs().t()) + 1e-30
        assert out.dtype == torch.float32 and out.shape == (rows, n)
        err = (out.double() - ref.double()).abs()
        assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("isa", ISAS)
def test_16bit_activations(built, isa):
    """bf16 rows are read in place and the bf16 result is the fp32 result rounded once; fp16
    is widened: the same as its fp32 values, returned in fp16. The fp32 path returns
    ``x.dtype`` too."""
    n, k = 17, 512
    w = cpp_int6(q6_blocks(n, k, seed=9), n, k)
    x = activations(5, k, seed=9)
    level = cpu.ISAS[isa]
    xb, xh = x.bfloat16(), x.half()
    got = cpu.int6_matmul_a8(xb, *w, isa=level)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu.int6_matmul_a8(xb.float(), *w, isa=level).bfloat16())
    got = cpu.int6_matmul_a8(xh, *w, isa=level)
    assert got.dtype == torch.float16
    assert torch.equal(got, cpu.int6_matmul_a8(xh.float(), *w, isa=level).half())
    wide = torch.cat([xb, torch.zeros(5, 64, dtype=torch.bfloat16)], 1)[:, :k]  # row stride
    assert torch.equal(cpu.int6_matmul_a8(wide, *w, isa=level),
                       cpu.int6_matmul_a8(xb, *w, isa=level))
    got = cpu.int6_matmul(xb, *w, isa=level)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu.int6_matmul(xb.float(), *w, isa=level).bfloat16())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["a8", "fp32"])
def test_batch_invariance(built, isa, op):
    """Row i of any M-row call (M = 1..16) equals the 1-row call bit for bit; one thread
    equals two (45 columns: several 4-column groups and a tail of 1)."""
    n, k = 45, 1536
    w = cpp_int6(q6_blocks(n, k, seed=4), n, k)
    fn = cpu.int6_matmul_a8 if op == "a8" else cpu.int6_matmul
    level = cpu.ISAS[isa]
    assert_batch_invariant(lambda a: fn(a, *w, isa=level), activations(16, k, seed=12))


def test_isa_paths_are_distinct(built):
    """The ISA levels run different code: fp32 low bits differ on random data between the
    levels the CPU has (so a forced level is not silently the same path)."""
    n, k = 64, 1536
    w = cpp_int6(q6_blocks(n, k, seed=6), n, k)
    x = activations(2, k, seed=6)
    levels = [lv for lv in (0, 1, 2) if lv <= cpu.best_isa()]
    if cpu.best_isa() == 2 and not cpu.has_vnni():
        levels.remove(2)  # the a8 op's level 2 is AVX2 without VNNI
    for fn in (cpu.int6_matmul_a8, cpu.int6_matmul):
        assert torch.equal(fn(x, *w), fn(x, *w, isa=cpu.active_isa()))  # isa=None: the active
        outs = [fn(x, *w, isa=lv) for lv in levels]
        for i in range(len(outs)):
            for j in range(i + 1, len(outs)):
                assert not torch.equal(outs[i], outs[j]), (fn.__name__, levels[i], levels[j])


def test_bad_layouts_raise(built):
    n, k = 4, 512
    w = cpp_int6(q6_blocks(n, k, seed=0), n, k)
    ql, qh, sc, d = w
    x = torch.randn(2, k)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        cpu.int6_matmul_a8(torch.randn(2, 384), ql[:, :192].contiguous(), qh, sc, d)
    with pytest.raises(RuntimeError, match="qlow must be"):
        cpu.int6_matmul_a8(torch.randn(2, 768), ql, qh, sc, d)
    with pytest.raises(RuntimeError, match="qhigh must be"):
        cpu.int6_matmul_a8(x, ql, qh[:, :64].contiguous(), sc, d)
    with pytest.raises(RuntimeError, match="scales must be contiguous int8"):
        cpu.int6_matmul(x, ql, qh, sc.float(), d)
    with pytest.raises(RuntimeError, match="super_scales must be contiguous fp16"):
        cpu.int6_matmul_a8(x, ql, qh, sc, d.float())
    with pytest.raises(RuntimeError, match="x must be"):
        cpu.int6_matmul_a8(x.double(), ql, qh, sc, d)
    with pytest.raises(RuntimeError, match="out must be"):
        cpu.int6_dequantize(ql, qh, sc, d, torch.empty(n, k, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="out must be"):
        cpu.int6_dequantize(ql, qh, sc, d, torch.empty(n + 1, k))
    raw = torch.from_numpy(q6_blocks(n, k, seed=0).reshape(-1))
    with pytest.raises(RuntimeError, match="whole rows"):
        cpu.gguf_repack_q6(raw[:-1], *[t.clone() for t in w])
    with pytest.raises(RuntimeError, match="outside"):
        cpu.gguf_repack_q6(raw, *[t.clone() for t in w], rows=torch.tensor([0, 1, 2, 4]))
    with pytest.raises(RuntimeError, match="hold 4 rows"):
        cpu.gguf_repack_q6(raw, *[t[:3].clone() for t in w])
    with pytest.raises(ValueError, match="K % 256"):
        reference.dequantize_int6(ql[:, :192], qh, sc, d)
