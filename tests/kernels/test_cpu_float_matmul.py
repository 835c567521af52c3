"""The C++ CPU float-weight matmul (``cpu.float_matmul`` over ``[N, K]`` fp32/bf16/fp16 weights,
``cpu.float_matmul_t`` over the fp32 layers' ``weight_t [K, N]``) against ``reference.linear``.

- Accuracy: every ISA path (``avx512``, ``avx2``, ``scalar``; clamped to what the CPU runs) on
  odd shapes (N and K not multiples of the tiles or lanes), M from 1 to 16, with and without a
  bias. Both sides sum K products in fp32 (the weights widened exactly), so each is within
  ``gamma_K = K * 2**-24`` of the exact sum relative to ``|x| @ |w|.T`` (Higham 3.1): the
  difference is checked against twice ``gamma_(K+2)`` (the bias add included), plus, for
  bf16 / fp16 results, one rounding of each side to the 8 / 11-bit format (``2**-8`` /
  ``2**-11`` relative).
- Batch invariance: row i of an M-row call equals the 1-row call bit for bit (M = 1..16, with
  K spanning several vector steps and a tail), one thread equals two.
- The float linear method (``engine/quant/methods.py``) takes these kernels for decode rows
  (its output equals the kernel's) and keeps ``F.linear`` / ``torch.mm`` for prefill rows.
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant
from .test_cpu_quant import ISAS, built  # noqa: F401  (the build fixture)

CASES = [(1, 16), (7, 19), (37, 64), (130, 100), (200, 576), (9, 1000)]  # (N, K)
ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def assert_close(out, ref, x, w, bias):
    """``|out - ref| <= 2 * gamma_(K+2) * (|x| @ |w|.T + |bias|) + u * (|out| + |ref|)``
    (module doc; u the output format's unit roundoff)."""
    k = x.shape[-1]
    absdot = x.abs().double() @ w.abs().double().t()
    if bias is not None:
        absdot = absdot + bias.abs().double()
    u = ROUNDING[out.dtype]
    bound = 2 * (k + 2) * 2.0**-24 * absdot + u * (out.double().abs() + ref.double().abs()) \
        + 1e-30
    err = (out.double() - ref.double()).abs()
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert bool((err <= bound).all()), f"max err {err.max():.3g}, bound there {bound.max():.3g}"


def data(n, k, rows, wdtype, xdtype, seed, with_bias):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(wdtype)
    x = torch.randn(rows, k, generator=gen).to(xdtype)
    b = (torch.randn(n, generator=gen)).to(wdtype) if with_bias else None
    return x, w, b


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", CASES)
@pytest.mark.parametrize("wdtype,xdtype", [
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
def test_float_matmul_matches_reference(built, monkeypatch, isa, n, k, wdtype, xdtype):
    if not built:  # (no C++ compiler, asserted by ``built``): the float layers run F.linear
        assert kernels._cpu() is None
        return
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    for rows in (1, 2, 3, 5, 8, 9, 16):
        x, w, b = data(n, k, rows, wdtype, xdtype, seed=n * k + rows, with_bias=rows % 2 == 1)
        out = cpu.float_matmul(x, w, b)
        assert_close(out, reference.linear(x, w, b), x.float(), w.float(),
                     None if b is None else b.float())
        if wdtype == torch.float32:
            out_t = cpu.float_matmul_t(x, w.t().contiguous(), b)
            assert_close(out_t, reference.linear(x, w, b), x.float(), w.float(),
                         None if b is None else b.float())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["nk_bf16", "nk_fp16", "nk_fp32", "kn_fp32"])
def test_batch_invariance(built, monkeypatch, isa, layout):
    """Row i of any M-row call (M = 1..16) equals the 1-row call bit for bit; one thread
    equals two. N spans several column blocks (and a ragged one), K several vector steps and
    a tail."""
    if not built:
        assert kernels._cpu() is None
        return
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    n, k = 300, 1037
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[layout[3:]]
    x, w, b = data(n, k, 16, dtype, dtype, seed=3, with_bias=True)
    if layout.startswith("kn"):
        wt = w.t().contiguous()
        assert_batch_invariant(lambda a: cpu.float_matmul_t(a, wt, b), x)
    else:
        assert_batch_invariant(lambda a: cpu.float_matmul(a, w, b), x)


def test_isa_paths_differ_only_in_rounding(built):
    """The three paths are distinct code (results not all equal on a long K) yet each within
    the fp32 bound of the reference: a guard against a dispatch that ignores ``isa``."""
    if not built:
        assert kernels._cpu() is None
        return
    x, w, _ = data(64, 4099, 4, torch.float32, torch.float32, seed=9, with_bias=False)
    outs = {isa: cpu.float_matmul(x, w, None, isa=cpu.ISAS[isa]) for isa in ISAS}
    for out in outs.values():
        assert_close(out, reference.linear(x, w), x, w, None)
    if cpu.best_isa() == cpu.ISAS["avx512"]:
        assert not torch.equal(outs["avx512"], outs["avx2"])
    if cpu.best_isa() >= cpu.ISAS["avx2"]:
        assert not torch.equal(outs["avx2"], outs["scalar"])


def test_bad_inputs_raise(built):
    if not built:
        assert kernels._cpu() is None
        return
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="weight"):
        cpu.float_matmul(x, torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="bias"):
        cpu.float_matmul(x, torch.randn(4, 8), torch.randn(5))
    with pytest.raises(RuntimeError, match="fp32"):
        cpu.float_matmul_t(x, torch.randn(8, 4).bfloat16())
    with pytest.raises(RuntimeError, match="fp32/bf16/fp16"):
        cpu.float_matmul(x.double(), torch.randn(4, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_linear_layer_dispatch(built, dtype):
    """``Linear`` under the float method: decode rows (M <= CPU_MAX_ROWS) equal the C++
    kernel's result (fp32 layers through their ``weight_t``), prefill rows ``F.linear`` /
    ``torch.mm``; the tied-embedding logits take the same method."""
    from localchat.engine.layers.embedding import VocabEmbedding
    from localchat.engine.layers.linear import Linear

    layer = Linear(96, 40, bias=True)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    w, b = layer.weight.data.clone(), layer.bias.data.clone()
    layer = layer.to(dtype)
    layer.process_weights_after_loading()
    assert (layer.weight_t is not None) == (dtype == torch.float32)
    emb = VocabEmbedding(40, 96).to(dtype)
    emb.weight.data.copy_(w)
    emb.process_weights_after_loading()
    x = torch.randn(20, 96).to(dtype)
    w, b = w.to(dtype), b.to(dtype)
    for rows in (1, 5, 16, 17, 20):
        got = layer(x[:rows])
        logits = emb.logits(x[:rows])
        if built and rows <= kernels.CPU_MAX_ROWS:
            assert torch.equal(got, cpu.float_matmul(x[:rows], w, b) if dtype != torch.float32
                               else cpu.float_matmul_t(x[:rows], w.t().contiguous(), b))
            assert torch.equal(logits, cpu.float_matmul(x[:rows], w))
        else:
            want = torch.nn.functional.linear(x[:rows], w, b)
            assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
        assert_close(got, reference.linear(x[:rows], w, b), x[:rows].float(), w.float(),
                     b.float())


@pytest.mark.parametrize("n,k", [(37, 19), (130, 64), (200, 576), (9, 4099)])
def test_bf16_dot_equals_its_fma_twin(built, n, k):
    """bf16 x bf16 on an AVX512_BF16 CPU: the ``vdpbf16ps`` tiles give the same bits as the
    FMA tiles they replace (two fmas per lane, odd column first, denormals flushed), every M;
    on other CPUs both calls run the FMA tiles."""
    if not built:
        assert kernels._cpu() is None
        return
    x, w, b = data(n, k, 16, torch.bfloat16, torch.bfloat16, seed=k, with_bias=True)
    isa = cpu.ISAS["avx512"]
    for rows in (1, 2, 5, 16):
        dot = torch.ops.localchat_cpu.float_matmul(x[:rows], w, b, isa, True)
        twin = torch.ops.localchat_cpu.float_matmul(x[:rows], w, b, isa, False)
        assert torch.equal(dot, twin)
