"""The AMX prefill GEMM (``localchat.kernels.cpu.int{4,5,6,8}_dequant_mm``, ``kernels/cpu/amx.h``)
against its reference: the layout's PyTorch dequantization (``reference.dequantize_int4`` /
``dequantize_int8``, ``reference_int5`` / ``reference_int6``), rounded to bf16, times the bf16
activations in float64.

Tolerance: the kernel multiplies the same bf16 values, sums the products in fp32 (the tile
unit's order: pairs, then 32-column k-steps) and rounds the result once to bf16, so
``|out - ref| <= 2^-8 |ref| + 2^-14 (|x| @ |w|.T)``: the bf16 rounding of the output (half an
ulp is 2^-9 relative) and the fp32 sum (its rounding errors grow like sqrt(K) u for these
random signs: about 2^-15.5 of the sum of magnitudes at K = 131328; the bound allows 2^-14).
A wrong pairing, a lost k-step or a mixed-up strip is off by whole products, far
outside it.

Shapes: M from 1 to 80 (one activation tile with a tail, pairs of tiles, an odd tile left
over after the pairs, 80 = 5 tiles), N not a multiple of the 32-row strip pair (a tail strip
of 4 rows, one of 20 rows), K of one and many k-steps. Only on CPUs with AMX (a hardware gate
like a GPU's; ``has_amx`` is False elsewhere and the prefill keeps its row-block route, whose
tests run everywhere), plus the dispatch in ``engine/quant/cpu_prefill.py`` on every CPU.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant import cpu_prefill
from localchat.kernels import cpu, reference

needs_amx = pytest.mark.skipif(not (cpu.available() and cpu.has_amx()),
                               reason="this CPU has no AMX bf16 tiles")
ROWS = [1, 16, 17, 33, 50, 80]


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    x[:, :32] *= 10  # a block of larger magnitude
    return x.bfloat16()


def assert_close(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                 weights_in_bf16: bool = True) -> None:
    """``out [M, N]`` bf16 against ``x @ w_bf16.T`` (``w`` itself when not
    ``weights_in_bf16``: the fp32 route) in float64 within the module's bound."""
    wb = (w.bfloat16() if weights_in_bf16 else w).double()
    ref = x.double() @ wb.T
    mag = x.double().abs() @ wb.abs().T
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    err = (out.double() - ref).abs()
    bound = 2.0**-8 * ref.abs() + 2.0**-14 * mag
    worst = (err - bound).max().item()
    assert worst <= 0, f"max excess {worst:.3g} over the bound (max err {err.max().item():.3g})"


def int4_weights(n: int, k: int, seed: int, g: int = 32, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    # fp16 values even as fp32 (GGUF's): q * s is then exact, so the kernels' fma and the
    # reference's product-then-sum round alike
    s = (torch.rand(n, k // g, generator=gen) * 0.02).half().to(dtype)
    m = (-torch.rand(n, k // g, generator=gen) * 0.1).half().to(dtype)
    return q, s, m


@needs_amx
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n,k", [(36, 64), (100, 512), (20, 1536)])
def test_int4_group_scales(m, n, k):
    """fp16 scales and mins (GGUF Q4_0 / Q4_1), groups of 32: the table-lookup rows."""
    q, s, mn = int4_weights(n, k, seed=m + n)
    x = activations(m, k, seed=k)
    w = reference.dequantize_int4(q, s.float(), mn.float(), 32)
    assert_close(cpu.int4_dequant_mm(x, q, s, mn, 32), x, w)


@needs_amx
@pytest.mark.parametrize("g,dtype", [(32, torch.float32), (64, torch.float16),
                                     (128, torch.float32)])
def test_int4_other_scales(g, dtype):
    """fp32 scales and groups wider than 32 (those take the row dequantizer)."""
    q, s, mn = int4_weights(50, 512, seed=g, g=g, dtype=dtype)
    x = activations(33, 512, seed=g)
    w = reference.dequantize_int4(q, s.float(), mn.float(), g)
    assert_close(cpu.int4_dequant_mm(x, q, s, mn, g), x, w)


@needs_amx
@pytest.mark.parametrize("m,k", [(17, 512), (80, 512), (17, 131328)])
def test_int4_two_level_scales(m, k):
    """GGUF Q4_K's scales folded per row; K = 131328 (4104 groups) is past the row buffer of
    int4k_rows_bf16_amx and takes the chunked widening instead."""
    from .test_cpu_kscales import kscale_weights

    q, sc, mn, sup = kscale_weights(20 if k > 4096 else 52, k, seed=m)
    x = activations(m, k, seed=m)
    w = reference.dequantize_int4(q, sc, mn, 32, sup)
    assert_close(cpu.int4_dequant_mm(x, q, sc, mn, 32, sup), x, w)


@needs_amx
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("with_mins", [False, True])
def test_int8(m, with_mins):
    gen = torch.Generator().manual_seed(m)
    n, k, g = 70, 256, 32
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, k // g, generator=gen) * 0.01
    mn = torch.randn(n, k // g, generator=gen) * 0.1 if with_mins else None
    x = activations(m, k, seed=m)
    w = reference.dequantize_int8(q, s, mn, g)
    assert_close(cpu.int8_dequant_mm(x, q, s, mn, g), x, w)


@needs_amx
@pytest.mark.parametrize("g", [16, 48, 8, 0])  # 0: per channel (1-D scales)
def test_int8_group_sizes(g):
    """fp16 scales (GGUF Q8_0's) in groups of 16 and 48 (two halves of a 32-column step in
    different groups), per channel, and a group of 8 (not a multiple of 16: the row
    dequantizer)."""
    gen = torch.Generator().manual_seed(g)
    n, k = 37, 480
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    shape = (n,) if g == 0 else (n, k // g)
    s = (torch.rand(*shape, generator=gen) * 0.01).half()
    x = activations(21, k, seed=g)
    w = reference.dequantize_int8(q, s.float(), None, k if g == 0 else g)
    assert_close(cpu.int8_dequant_mm(x, q, s, None, k if g == 0 else g), x, w)


@needs_amx
@pytest.mark.parametrize("m", [1, 17, 50])
@pytest.mark.parametrize("layout", ["int5", "int6"])
def test_bit_planes(layout, m):
    """The int5 (GGUF Q5_0) and int6 (Q6_K) layouts, repacked from random blocks."""
    if layout == "int5":
        from localchat.kernels.reference_int5 import dequantize_int5 as dequantize

        from .test_int5 import cpp_int5 as repack, q5_blocks as blocks
        n, k, op = 45, 384, cpu.int5_dequant_mm
    else:
        from localchat.kernels.reference_int6 import dequantize_int6 as dequantize

        from .test_int6 import cpp_int6 as repack, q6_blocks as blocks
        n, k, op = 45, 512, cpu.int6_dequant_mm
    planes = repack(blocks(n, k, seed=m), n, k)
    x = activations(m, k, seed=m)
    assert_close(op(x, *planes), x, dequantize(*planes))


@needs_amx
def test_bad_inputs_raise():
    q, s, mn = int4_weights(8, 64, seed=0)
    with pytest.raises(RuntimeError, match="bf16"):
        cpu.int4_dequant_mm(torch.randn(3, 64), q, s, mn, 32)
    with pytest.raises(RuntimeError, match="x must be"):
        cpu.int4_dequant_mm(activations(3, 96, 0), q, s, mn, 32)


def test_prefill_dispatch(monkeypatch):
    """``blockwise_mm`` takes the layout's AMX GEMM for bf16 x of at most AMX_MAX_ROWS rows
    where the CPU has AMX, and the row blocks + torch.mm otherwise; both give x @ w.T."""
    if not cpu.available():
        pytest.skip("no C++ kernels: the prefill has only the PyTorch route")
    q, s, mn = int4_weights(40, 128, seed=1)
    w = reference.dequantize_int4(q, s.float(), mn.float(), 32)
    calls = []

    def fill(a, b, out):
        cpu.int4_dequantize(q[a:a + b], s[a:a + b], mn[a:a + b], 32, out)

    def amx(xb):
        calls.append(xb.shape[0])
        return cpu.int4_dequant_mm(xb, q, s, mn, 32)

    for m, dtype in ((20, torch.bfloat16), (cpu_prefill.AMX_MAX_ROWS + 1, torch.bfloat16),
                     (20, torch.float32)):
        x = activations(m, 128, seed=m).to(dtype)  # bf16 values either way
        out = cpu_prefill.blockwise_mm(x, 40, 128, fill, amx=amx)
        assert out.dtype == dtype
        assert_close(out.bfloat16(), x, w, weights_in_bf16=dtype == torch.bfloat16)
    assert calls == ([20] if cpu.amx_enabled() else [])
    monkeypatch.setattr(cpu_prefill, "AMX_MAX_ROWS", 0)
    calls.clear()
    cpu_prefill.blockwise_mm(activations(20, 128, 0), 40, 128, fill, amx=amx)
    assert calls == []


def test_env_turns_it_off(monkeypatch):
    if not cpu.available():
        pytest.skip("no C++ kernels")
    monkeypatch.setenv("LOCALCHAT_CPU_AMX", "0")
    cpu.amx_enabled.cache_clear()
    try:
        assert cpu.amx_enabled() is False
    finally:
        monkeypatch.delenv("LOCALCHAT_CPU_AMX")
        cpu.amx_enabled.cache_clear()
    assert cpu.amx_enabled() == (cpu.has_amx() and cpu.active_isa() >= 2)
