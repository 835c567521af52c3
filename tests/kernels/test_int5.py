"""The int5 layout (GGUF Q5_0 held exactly, ``kernels/cpu/qa5.h``): the numpy and C++ repacks,
the dequantization, the integer-dot matmul ``int5_matmul_a8`` and the exact fp32-activation
``int5_matmul``, against ``gguf.quants.dequantize`` and ``reference.*int5*``.

- Repack / dequantize: random valid Q5_0 blocks (random bytes, fp16 ``d`` finite of both signs
  from subnormal-adjacent to large) and the real Q5_0 tensors of Qwen2.5-Coder-0.5B
  (``-m slow``, skipped when the model is not downloaded): the numpy repack, the C++ repack
  (equal to it byte for byte, with and without a row permutation, over two threads' chunks),
  then the reference and every ISA's dequantization equal to ``gguf.quants.dequantize`` bit for
  bit in fp32, and that rounded to nearest even in bf16.
- ``int5_matmul_a8`` vs ``reference.int5_matmul_a8``: the activations quantize to the same
  integers on every path and every lane dot is an exact int32, so the two differ only in the
  fp32 summation order of their terms (the reference sums ``K / 32`` block terms, the kernels
  ``K / 8`` lane terms then a reduction): each is within ``gamma_T * A`` of the exact sum
  (Higham 3.1), ``A`` the sum of the terms' magnitudes; checked against
  ``4 * gamma_(K/8 + 20) * A`` (the factor covers the roundings of each term's scale).
- ``int5_matmul`` vs ``reference.int5_matmul`` (fp32 activations, the same exact weights):
  each side within ``gamma_K * sum_k |x| |w|`` of the exact dot: ``2 * gamma_(K+16)`` of it.
- Every ISA path (``avx512`` = VNNI for the integer dot where the CPU has it, else AVX2;
  ``avx2``; ``scalar``; a level the CPU lacks is clamped, as in the other kernel tests),
  M = 1..16, N in (1, 3, 5, 17), K in (128, 384, 896), extreme weights (all u = 0 / 31,
  large d); batch and thread invariance bit for bit; the launchers' checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.engine.quant.int5_layout import pack_int5, q5_0_values, repack_q5_0
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant

gguf = pytest.importorskip("gguf")

ISAS = ["avx512", "avx2", "scalar"]
U = 2.0**-24
SHAPES = [(n, k) for n in (1, 3, 5, 17) for k in (128, 384, 896)]
MODELS = Path.home() / ".cache" / "localchat" / "models"
Q5_0 = 6


def q5_blocks(n: int, k: int, seed: int, extreme: str | None = None) -> np.ndarray:
    """``[n, k // 32 * 22]`` uint8 Q5_0 rows: random bytes, finite fp16 ``d`` of both signs;
    ``extreme`` = "low" / "high": every u = 0 / 31 and ``|d|`` near 2^4."""
    rng = np.random.default_rng(seed)
    nb = n * k // 32
    raw = rng.integers(0, 256, size=(nb, 22), dtype=np.uint8)
    lo_exp = 3 if extreme else -14
    mag = np.exp2(rng.uniform(lo_exp, 4, nb)) * rng.choice([-1.0, 1.0], nb)
    raw[:, 0:2] = mag.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if extreme:
        raw[:, 2:22] = 0 if extreme == "low" else 0xFF
    return raw.reshape(n, -1)


def gguf_values(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q5_0))


def numpy_int5(raw: np.ndarray, n: int, k: int, rows=None) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(a) for a in repack_q5_0(raw, n, k, rows))


def cpp_int5(raw: np.ndarray, n: int, k: int, rows=None) -> tuple[torch.Tensor, ...]:
    t = (torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // 8, dtype=torch.uint8),
         torch.empty(n, k // 32, dtype=torch.float16))
    cpu.gguf_repack_q5(torch.from_numpy(np.ascontiguousarray(raw).reshape(-1)), *t,
                       None if rows is None else torch.as_tensor(rows, dtype=torch.int64))
    return t


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    x[:, :32] *= 10  # blocks of different magnitude
    x[0, 32:64] = 0  # an all-zero block (d = 0)
    return x


def same_bytes(a: tuple, b: tuple) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
               for x, y in zip(a, b, strict=True))


# --- layout and repack ------------------------------------------------------------------


def test_q5_0_values_follow_ggml_block_format():
    """u of one hand-made block: element j < 16 low nibble of qs[j], j + 16 the high nibble,
    bit j of the little-endian qh its top bit."""
    block = np.zeros((1, 22), np.uint8)
    block[0, 6:22] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    qh = (1 << 0) | (1 << 15) | (1 << 16) | (1 << 31)
    block[0, 2:6] = np.frombuffer(np.uint32(qh).tobytes(), np.uint8)
    want = list(range(16)) + list(range(15, -1, -1))
    for j in (0, 15, 16, 31):
        want[j] += 16
    assert q5_0_values(block)[0].tolist() == want


def test_pack_int5_follows_the_documented_bits():
    """qlow / qhigh bit by bit as the layout's docstring states, by explicit loops."""
    rng = np.random.default_rng(0)
    u = rng.integers(0, 32, size=(3, 256), dtype=np.uint8)
    qlow, qhigh = pack_int5(u)
    assert qlow.shape == (3, 128) and qhigh.shape == (3, 32)
    for n in range(3):
        for c in range(2):
            for i in range(64):
                col = 128 * c + 2 * i
                assert qlow[n, 64 * c + i] == (u[n, col] & 15) | ((u[n, col + 1] & 15) << 4)
                for odd in (0, 1):
                    byte = qhigh[n, 16 * c + 8 * odd + i // 8]
                    assert (byte >> (i % 8)) & 1 == u[n, col + odd] >> 4
    assert torch.equal(reference.unpack_int5(torch.from_numpy(qlow), torch.from_numpy(qhigh)),
                       torch.from_numpy(u))


@pytest.mark.parametrize("n,k", [(1, 128), (3, 512), (17, 896)])
def test_numpy_repack_dequantizes_like_gguf(n, k):
    raw = q5_blocks(n, k, seed=n + k)
    ql, qh, d = numpy_int5(raw, n, k)
    assert (ql.dtype, qh.dtype, d.dtype) == (torch.uint8, torch.uint8, torch.float16)
    assert (ql.shape, qh.shape, d.shape) == ((n, k // 2), (n, k // 8), (n, k // 32))
    got = reference.dequantize_int5(ql, qh, d)
    assert got.dtype == torch.float32 and torch.equal(got, gguf_values(raw))
    u = q5_0_values(raw.reshape(-1, 22)).reshape(n, k)
    assert torch.equal(reference.unpack_int5(ql, qh), torch.from_numpy(u))


def test_numpy_repack_rows_and_errors():
    raw = q5_blocks(4, 256, seed=1)
    rows = np.array([2, 0, 3, 1, 1])
    got = numpy_int5(raw, 5, 256, rows)
    want = numpy_int5(raw[rows], 5, 256)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="multiple of 128"):
        repack_q5_0(q5_blocks(4, 96, seed=1), 4, 96)
    with pytest.raises(ValueError, match="hold 4 rows"):
        repack_q5_0(raw, 3, 256)
    with pytest.raises(ValueError, match="whole rows"):
        repack_q5_0(raw.reshape(-1)[:-1], 4, 256)


@pytest.mark.parametrize("n,k", [(1, 128), (7, 512), (17, 896), (1300, 384)])
def test_cpp_repack_equals_numpy(built, n, k):
    """Byte for byte (fp16 scales as bits); 1300 rows of 264 bytes span two threads' chunks."""
    raw = q5_blocks(n, k, seed=n * k)
    assert same_bytes(cpp_int5(raw, n, k), numpy_int5(raw, n, k))
    rows = np.random.default_rng(n).integers(0, n, size=n + 2)  # a permutation with repeats
    assert same_bytes(cpp_int5(raw, n + 2, k, rows), numpy_int5(raw, n + 2, k, rows))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 128), (5, 512), (17, 896), (40, 2560)])
def test_dequantize_matches_gguf(built, isa, n, k):
    raw = q5_blocks(n, k, seed=3 * n + k)
    w = cpp_int5(raw, n, k)
    want = gguf_values(raw)
    out = torch.full((n, k), float("nan"))
    cpu.int5_dequantize(*w, out, cpu.ISAS[isa])
    assert torch.equal(out, want)
    outb = torch.zeros(n, k, dtype=torch.bfloat16)
    cpu.int5_dequantize(*w, outb, cpu.ISAS[isa])
    assert torch.equal(outb, want.bfloat16())
    assert torch.equal(reference.dequantize_int5(*w), want)


def _real_q5_0_tensors(names):
    from localchat.engine.loader.gguf_header import read_gguf_header

    path = MODELS / "qwen2.5-coder-0.5b" / "Qwen2.5-Coder-0.5B-Instruct.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not downloaded")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    found = {}
    for t in read_gguf_header(path).tensors:
        if t.name in names:
            assert t.ggml_type == Q5_0, t.name
            k, n = t.dims
            found[t.name] = (np.asarray(data[t.offset:t.offset + t.n_bytes]).reshape(n, -1), n, k)
    assert set(found) == set(names)
    return [found[name] for name in names]


@pytest.mark.slow  # the Qwen pair is for slow tests (DESIGN.md section 7)
def test_real_q5_0_tensors(built):
    """Qwen2.5-Coder-0.5B's Q5_0 tensors of layer 0 (q 896 x 896, k 128 x 896, gate 4864 x 896)
    and the first 2048 rows of token_embd: both repacks agree, the dequantization (reference,
    every ISA) is gguf's bit for bit, and the integer-dot matmul is within its bound."""
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_gate.weight",
             "token_embd.weight"]
    for raw, n, k in _real_q5_0_tensors(names):
        raw, n = raw[:2048], min(n, 2048)
        want = gguf_values(raw)
        w = cpp_int5(raw, n, k)
        assert same_bytes(w, numpy_int5(raw, n, k))
        assert torch.equal(reference.dequantize_int5(*w), want)
        for isa in ISAS:
            out = torch.empty(n, k)
            cpu.int5_dequantize(*w, out, cpu.ISAS[isa])
            assert torch.equal(out, want), isa
        x = activations(3, k, seed=5)
        assert_a8_close(cpu.int5_matmul_a8(x, *w), x, w)


# --- matmuls ------------------------------------------------------------------------------


def assert_a8_close(out, x, w):
    """``|out - ref| <= 4 * gamma_(K/8 + 20) * A`` (module doc), ``A`` the terms of
    ``|xq|``, ``|u - 16|``, ``|d|``, ``d_act``."""
    ql, qh, d = w
    ref = reference.int5_matmul_a8(x.float(), *w)
    xq, da = reference.quantize_activations_int8(x.float())
    m, k = x.shape
    n = ql.shape[0]
    q = (reference.unpack_int5(ql, qh).double() - 16).abs()
    dots = torch.einsum("mjs,njs->mnj", xq.double().abs().view(m, k // 32, 32),
                        q.view(n, k // 32, 32))
    sd = d.double().abs()[None] * da.double()[:, None]
    mag = (dots * sd).sum(-1)
    bound = 4 * (k // 8 + 20) * U * mag + 1e-30
    err = (out.double() - ref.double()).abs()
    assert out.shape == ref.shape == (m, n)
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_int5_a8_matches_reference(built, isa, n, k):
    w = cpp_int5(q5_blocks(n, k, seed=n + 7 * k), n, k)
    x = activations(16, k, seed=n + k)
    for rows in range(1, 17):
        out = cpu.int5_matmul_a8(x[:rows], *w, isa=cpu.ISAS[isa])
        assert out.dtype == torch.float32
        assert_a8_close(out, x[:rows], w)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("extreme", ["low", "high"])
def test_int5_a8_extreme_weights(built, isa, extreme):
    """u = 0 everywhere (q = -16: the dot is all offset) or 31, activations at +-127 after
    quantization: the largest int32 dots and int16 pair sums."""
    n, k = 5, 896
    w = cpp_int5(q5_blocks(n, k, seed=2, extreme=extreme), n, k)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    out = cpu.int5_matmul_a8(x, *w, isa=cpu.ISAS[isa])
    assert_a8_close(out, x, w)
    # close to exact here: every term is +-(16 or 15) * 127 * 8 * d * (1/127) per lane
    want = x @ reference.dequantize_int5(*w).t()
    assert torch.allclose(out, want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_int5_fp32_matches_reference(built, isa, n, k):
    w = cpp_int5(q5_blocks(n, k, seed=n + 11 * k), n, k)
    wf = reference.dequantize_int5(*w)
    x = activations(16, k, seed=2 * n + k)
    for rows in range(1, 17):
        xr = x[:rows]
        out = cpu.int5_matmul(xr, *w, isa=cpu.ISAS[isa])
        ref = reference.int5_matmul(xr, *w)
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
    w = cpp_int5(q5_blocks(n, k, seed=9), n, k)
    x = activations(5, k, seed=9)
    level = cpu.ISAS[isa]
    xb, xh = x.bfloat16(), x.half()
    got = cpu.int5_matmul_a8(xb, *w, isa=level)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu.int5_matmul_a8(xb.float(), *w, isa=level).bfloat16())
    got = cpu.int5_matmul_a8(xh, *w, isa=level)
    assert got.dtype == torch.float16
    assert torch.equal(got, cpu.int5_matmul_a8(xh.float(), *w, isa=level).half())
    wide = torch.cat([xb, torch.zeros(5, 64, dtype=torch.bfloat16)], 1)[:, :k]  # row stride
    assert torch.equal(cpu.int5_matmul_a8(wide, *w, isa=level),
                       cpu.int5_matmul_a8(xb, *w, isa=level))
    got = cpu.int5_matmul(xb, *w, isa=level)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu.int5_matmul(xb.float(), *w, isa=level).bfloat16())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["a8", "fp32"])
def test_batch_invariance(built, isa, op):
    """Row i of any M-row call (M = 1..16) equals the 1-row call bit for bit; one thread
    equals two (45 columns: several 4-column groups and a tail of 1)."""
    n, k = 45, 896
    w = cpp_int5(q5_blocks(n, k, seed=4), n, k)
    fn = cpu.int5_matmul_a8 if op == "a8" else cpu.int5_matmul
    level = cpu.ISAS[isa]
    assert_batch_invariant(lambda a: fn(a, *w, isa=level), activations(16, k, seed=12))


def test_isa_paths_are_distinct(built):
    """The ISA levels run different code: fp32 low bits differ on random data between the
    levels the CPU has (so a forced level is not silently the same path)."""
    n, k = 64, 1536
    w = cpp_int5(q5_blocks(n, k, seed=6), n, k)
    x = activations(2, k, seed=6)
    levels = [lv for lv in (0, 1, 2) if lv <= cpu.best_isa()]
    if cpu.best_isa() == 2 and not cpu.has_vnni():
        levels.remove(2)  # the a8 op's level 2 is AVX2 without VNNI
    for fn in (cpu.int5_matmul_a8, cpu.int5_matmul):
        assert torch.equal(fn(x, *w), fn(x, *w, isa=cpu.active_isa()))  # isa=None: the active
        outs = [fn(x, *w, isa=lv) for lv in levels]
        for i in range(len(outs)):
            for j in range(i + 1, len(outs)):
                assert not torch.equal(outs[i], outs[j]), (fn.__name__, levels[i], levels[j])


def test_bad_layouts_raise(built):
    n, k = 4, 256
    w = cpp_int5(q5_blocks(n, k, seed=0), n, k)
    ql, qh, d = w
    x = torch.randn(2, k)
    with pytest.raises(RuntimeError, match="multiple of 128"):
        cpu.int5_matmul_a8(torch.randn(2, 96), ql[:, :48].contiguous(), qh, d)
    with pytest.raises(RuntimeError, match="qlow must be"):
        cpu.int5_matmul_a8(torch.randn(2, 384), ql, qh, d)
    with pytest.raises(RuntimeError, match="qhigh must be"):
        cpu.int5_matmul_a8(x, ql, qh[:, :16].contiguous(), d)
    with pytest.raises(RuntimeError, match="scales must be contiguous fp16"):
        cpu.int5_matmul(x, ql, qh, d.float())
    with pytest.raises(RuntimeError, match="x must be"):
        cpu.int5_matmul_a8(x.double(), ql, qh, d)
    with pytest.raises(RuntimeError, match="out must be"):
        cpu.int5_dequantize(ql, qh, d, torch.empty(n, k, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="out must be"):
        cpu.int5_dequantize(ql, qh, d, torch.empty(n + 1, k))
    raw = torch.from_numpy(q5_blocks(n, k, seed=0).reshape(-1))
    with pytest.raises(RuntimeError, match="whole rows"):
        cpu.gguf_repack_q5(raw[:-1], *[t.clone() for t in w])
    with pytest.raises(RuntimeError, match="outside"):
        cpu.gguf_repack_q5(raw, *[t.clone() for t in w], rows=torch.tensor([0, 1, 2, 4]))
    with pytest.raises(RuntimeError, match="hold 4 rows"):
        cpu.gguf_repack_q5(raw, *[t[:3].clone() for t in w])
    with pytest.raises(ValueError, match="K % 128"):
        reference.dequantize_int5(ql[:, :48], qh, d)
