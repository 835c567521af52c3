"""The exact fp32 matmuls over the one-level int4 (Q4_0 / Q4_1), int5 (Q5_0) and int8 (Q8_0)
panel layouts (``kernels/cpu/panelf*.cpp``, ``cpu.int{4,5,8}_panel_f32``): the rows an fp32
engine keeps out of the integer-dot kernels (short prompt steps, logits rows).

- Layout and values: one-hot activation rows read every weight back bit for bit, equal to the
  row layout's dequantized values computed here in float64 (``q * s + m``, exact, then rounded
  once to fp32, as the kernels' ``fma(q, s, m)``; int5: ``reference.dequantize_int5``'s
  values, ``gguf.quants.dequantize``'s; its K a multiple of 128, the row layout's chunk).
- Random activations against float64 ``x @ w.T`` over those values, within the bound of a
  sequential fp32 sum of K fused multiply-adds: ``(K + 1) * 2^-24 * sum_k |x_k w_k|``.
- The portable kernel equals the AVX2 one bit for bit; batch and thread invariance for M from
  1 past the 5-row passes to 16; the launcher's checks.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int4 import unpack_int4
from localchat.engine.quant.int4_panel import to_panel
from localchat.engine.quant.int5_panel import to_panel5
from localchat.engine.quant.int8_panel import to_panel8
from localchat.kernels import cpu, reference

from .batch_invariance import assert_batch_invariant
from .test_cpu_panel import one_level_weights
from .test_cpu_panel8 import q8_weights
from .test_cpu_quant_a8 import built  # noqa: F401
from .test_int5 import cpp_int5, q5_blocks

U = 2.0 ** -24
SHAPES = [(16, 32), (48, 576), (80, 160), (112, 1536)]  # (N, K): 1 to 7 tiles, odd tile counts
ROWS = [1, 2, 3, 5, 6, 11, 16]
LEVELS = [1, 0]  # AVX2 (an AVX-512 CPU runs it too), portable


def _int4(n: int, k: int, seed: int):
    """``(call(x, isa), w fp32 [N, K])``: the int4 panel op and the exact weight values."""
    q, s, m = one_level_weights(n, k, seed)
    qp, ps, pm, _ = to_panel(q, s, m)
    w = (unpack_int4(q).double() * s.double().repeat_interleave(32, 1)
         + m.double().repeat_interleave(32, 1)).float()
    return (lambda x, isa=None: cpu.int4_panel_f32(x, qp, ps, pm, isa)), w


def _int8(n: int, k: int, seed: int):
    q, s = q8_weights(n, k, seed)
    qp, ps = to_panel8(q, s)
    w = (q.double() * s.double().repeat_interleave(32, 1)).float()
    return (lambda x, isa=None: cpu.int8_panel_f32(x, qp, ps, isa)), w


def _int5(n: int, k: int, seed: int):
    w = cpp_int5(q5_blocks(n, k, seed=seed), n, k)
    plow, phigh, pscales = to_panel5(*w)
    return (lambda x, isa=None: cpu.int5_panel_f32(x, plow, phigh, pscales, isa)), \
        reference.dequantize_int5(*w)


def _fit(kind: str, k: int) -> int:
    """``k``, rounded up to a multiple of 128 for int5 (its row layout's chunk)."""
    return -(-k // 128) * 128 if kind == "int5" else k


KINDS = {"int4": _int4, "int5": _int5, "int8": _int8}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("isa", LEVELS)
def test_one_hot_rows_read_every_weight_exactly(built, kind, n, k, isa):  # noqa: F811
    k = _fit(kind, k)
    call, w = KINDS[kind](n, k, seed=n + k)
    eye = torch.eye(k)
    got = torch.cat([call(eye[k0:k0 + 16], isa) for k0 in range(0, k, 16)])
    assert torch.equal(got, w.T)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_matches_float64_within_the_sequential_sum_bound(built, kind, n, k, rows):  # noqa: F811
    k = _fit(kind, k)
    call, w = KINDS[kind](n, k, seed=3 * n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows + k))
    out = call(x)
    ref = x.double() @ w.double().T
    bound = (k + 1) * U * (x.double().abs() @ w.double().abs().T) + 1e-30
    err = (out.double() - ref).abs()
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max():.3g}"
    assert torch.equal(out, call(x, 0)), "the portable kernel differs from the AVX2 one"


@pytest.mark.parametrize("kind", KINDS)
def test_batch_and_thread_invariant(built, kind):  # noqa: F811
    k = _fit(kind, 576)
    call, _ = KINDS[kind](80, k, seed=7)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(1))
    assert_batch_invariant(call, x)


@pytest.mark.parametrize("kind", KINDS)
def test_16_bit_activations_are_widened_and_the_result_rounded(built, kind):  # noqa: F811
    k = _fit(kind, 160)
    call, _ = KINDS[kind](48, k, seed=5)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2)).bfloat16()
    out = call(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, call(x.float()).bfloat16())


def test_launcher_rejects_bad_layouts(built):  # noqa: F811
    q, s, m = one_level_weights(32, 64, seed=1)
    qp, ps, pm, _ = to_panel(q, s, m)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        cpu.int4_panel_f32(torch.randn(1, 48), qp[:, :6], ps, pm)
    with pytest.raises(RuntimeError, match="qpanel must be"):
        cpu.int4_panel_f32(torch.randn(1, 64), qp[:, :4], ps, pm)
    with pytest.raises(RuntimeError, match="pmins must be"):
        cpu.int4_panel_f32(torch.randn(1, 64), qp, ps, pm.float())
    with pytest.raises(RuntimeError, match="x must be"):
        cpu.int4_panel_f32(torch.ones(1, 64, dtype=torch.int32), qp, ps, pm)
    q8, s8 = to_panel8(*q8_weights(32, 64, seed=2))
    with pytest.raises(RuntimeError, match="qpanel must be"):
        cpu.int8_panel_f32(torch.randn(1, 64), q8.view(torch.uint8), s8)
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int8_panel_f32(torch.randn(1, 64), q8, s8[:1])
    pl, ph, p5 = to_panel5(*cpp_int5(q5_blocks(32, 128, seed=3), 32, 128))
    with pytest.raises(RuntimeError, match="phigh must be"):
        cpu.int5_panel_f32(torch.randn(1, 128), pl, ph[:, :, :32], p5)
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int5_panel_f32(torch.randn(1, 128), pl, ph, p5.float())
