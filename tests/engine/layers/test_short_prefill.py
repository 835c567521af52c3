"""Short fp32 prefills of quantized CPU layers (``CPU_MAX_ROWS < M <= SHORT_PREFILL_MAX_ROWS``)
run as 16-row chunks on the exact fp32-activation C++ row kernels (``Linear.forward``,
``kernels.short_prefill_chunks``) rather than the prefill GEMM over every weight dequantized.

Checked against independent references: each row equals the one-row call bit for bit (the row
kernels are batch invariant), the whole agrees with the dequantized reference within the
fp32-accumulation bound ``2 * gamma_K * (|x| @ |w|.T)``, and inside ``kernels.a8_fp32()`` (an
auto-fp32 engine's step, whose decode rows take int8 activations) a short prompt's rows still
take the exact kernels. 65 rows keep the prefill GEMM (equal to ``blockwise_int4``), bf16 rows
keep theirs, and float weights keep ``torch.mm``."""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant import cpu_int4
from localchat.engine.quant.int4_method import Int4LinearMethod
from localchat.kernels import cpu, reference

pytestmark = pytest.mark.skipif(not cpu.available(), reason="the row kernels are C++")


@pytest.fixture
def layer(monkeypatch):
    monkeypatch.delenv("LOCALCHAT_CPU_INT4", raising=False)
    monkeypatch.delenv(kernels.A8_ENV, raising=False)  # auto: a8_fp32() turns fp32 rows a8
    kernels.refresh_env()
    torch.manual_seed(0)
    lin = Linear(256, 96, bias=True)
    lin.weight.data.normal_()
    lin.bias.data.normal_()
    lin.quant_method = Int4LinearMethod("cpu", 32)
    lin.quant_method.quantize_weights(lin)
    lin.process_weights_after_loading()
    assert lin.quant_method.exact_cpu_rows(lin)
    yield lin
    kernels.refresh_env()


def _reference(lin, x):
    w = reference.dequantize_int4(lin.qweight, lin.scales, lin.mins, 32)
    bound = 2 * 258 * 2.0**-24 * (x.abs() @ w.abs().t()) + 1e-6 * lin.bias.abs()
    return x @ w.t() + lin.bias, bound


@pytest.mark.parametrize("rows", [17, 40, kernels.SHORT_PREFILL_MAX_ROWS])
def test_short_prefill_rows_are_the_exact_row_kernels(layer, rows):
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    assert kernels.short_prefill_chunks(x)
    y = layer(x)
    one_by_one = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
    assert torch.equal(y, one_by_one)
    want, bound = _reference(layer, x)
    assert bool(((y - want).abs() <= bound).all())
    with kernels.a8_fp32():  # an a8 engine step: decode rows change, a short prompt does not
        assert not torch.equal(layer(x[:1]), y[:1])
        assert torch.equal(layer(x), y)


def test_longer_and_bf16_prefills_keep_the_gemm(layer):
    x = torch.randn(kernels.SHORT_PREFILL_MAX_ROWS + 1, 256,
                    generator=torch.Generator().manual_seed(3))
    assert not kernels.short_prefill_chunks(x)
    gemm = cpu_int4.blockwise_int4(x, layer.qweight, layer.scales, layer.mins, 32) + layer.bias
    assert torch.equal(layer(x), gemm)
    assert not kernels.short_prefill_chunks(x[:40].bfloat16())


def test_float_weights_keep_torch_mm():
    lin = Linear(64, 48)
    lin.weight.data.normal_()
    lin.process_weights_after_loading()
    assert not lin.quant_method.exact_cpu_rows(lin)
    x = torch.randn(40, 64)
    assert torch.equal(lin(x), lin.quant_method.apply(lin, x))


@pytest.mark.parametrize("rows", [17, 40])
def test_a_drafts_short_prefill_keeps_the_integer_dot_kernels(layer, rows):
    """Inside ``kernels.inexact_prompts()`` (a draft model's forward) within ``a8_fp32()``,
    a short prefill's 16-row chunks take the integer-dot kernels, each row equal to that row
    alone through them (also batch invariant), and no longer the exact fp32 result; outside
    ``a8_fp32`` the context changes nothing."""
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows + 1))
    exact = layer(x)
    with kernels.a8_fp32(), kernels.inexact_prompts():
        y = layer(x)
        one_by_one = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
    assert torch.equal(y, one_by_one)
    assert not torch.equal(y, exact)
    want, _ = _reference(layer, x)
    # int8 activations: each row within 2% of its exact result's scale
    assert float((y - want).abs().max()) <= 0.02 * float(want.abs().max())
    with kernels.inexact_prompts():
        assert torch.equal(layer(x), exact)
    assert kernels.exact_prompts()
