"""Prefill (``M > CPU_MAX_ROWS`` rows) of CPU group-wise int8 layers (``Int8GroupLinearMethod``,
the native format's Q5_x / Q6_K / Q8_0 layers): weight rows dequantized by the C++
``int8_dequantize`` into the scratch every layer shares, then ``torch.mm`` in bf16 for bf16
activations, else fp32 (``engine/quant/cpu_prefill.py``); without the C++ kernels PyTorch ops
dequantize the blocks and the GEMM runs in fp32.

Reference: ``reference.dequantize_int8`` then a float64 matmul. Tolerances (Higham, *Accuracy
and Stability of Numerical Algorithms*, 3.1; ``gamma_n = n * 2**-24``):

- fp32: the GEMM sums K fp32 products in some order, the bias adds one rounding:
  ``|y - ref| <= 2 * gamma_(K+2) * (|x| @ |w|.T + |bias|)`` (twice the worst case, which
  holds whatever the blocking, lane count or FMA use);
- bf16: the weights rounded once to bf16 (exact products in fp32), the fp32 sums rounded once
  to bf16 (relative error <= 2**-8): ``|y - ref_b| <= 2**-8 * |ref_b| + 2 * gamma_(K+2) *
  (|x| @ |w_b|.T)``, ``ref_b`` the float64 product of the bf16 inputs (on the PyTorch path,
  of the bf16 activations and the fp32 weights).
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant import cpu_prefill, native
from localchat.engine.quant.native import Int8GroupLinearMethod
from localchat.kernels import cpu, reference

M = kernels.CPU_MAX_ROWS + 24  # prefill rows


def _layer(n, k, g, with_mins, scale_dtype, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias)
    layer.quant_method = Int8GroupLinearMethod("cpu", g, with_mins, scale_dtype=scale_dtype)
    layer.quant_method.create_weights(layer, torch.device("cpu"))
    layer.qweight.copy_(torch.randint(-32, 32, (n, k), generator=gen, dtype=torch.int8))
    layer.scales.copy_(torch.rand(n, k // g, generator=gen) * 0.02 + 1e-3)
    if with_mins:
        layer.mins.copy_(torch.randn(n, k // g, generator=gen) * 0.05)
    if bias:
        layer.bias.data.normal_(generator=gen)
    layer.process_weights_after_loading()
    w = reference.dequantize_int8(layer.qweight, layer.scales,
                                  layer.mins if with_mins else None, g)
    return layer, w


def _assert_fp32(y, x, w, bias=None):
    k = x.shape[-1]
    b = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else bias.double()
    ref = x.double() @ w.double().t() + b
    bound = 2 * (k + 2) * 2.0**-24 * (x.abs().double() @ w.abs().double().t() + b.abs())
    err = (y.double() - ref).abs()
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert bool((err <= bound).all()), f"max err {err.max():.3g}"


def _assert_bf16(y, x, w, weights_bf16=None):
    """``weights_bf16``: the GEMM's weights are ``w`` rounded to bf16 (the C++ path; default
    where the C++ kernels are built), else ``w`` itself in fp32 (the PyTorch path)."""
    if weights_bf16 is None:
        weights_bf16 = cpu.available()
    k = x.shape[-1]
    xb = x.bfloat16().double()
    wb = w.bfloat16().double() if weights_bf16 else w.double()
    ref = xb @ wb.t()
    bound = 2.0**-8 * ref.abs() + 2 * (k + 2) * 2.0**-24 * (xb.abs() @ wb.abs().t())
    err = (y.double() - ref).abs()
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert bool((err <= bound).all()), f"max err {err.max():.3g}"


@pytest.mark.parametrize("g,n,k", [(16, 37, 96), (32, 130, 256), (256, 9, 256)])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("with_mins", [False, True])
def test_prefill_matches_dequantize_and_mm(g, n, k, scale_dtype, with_mins):
    layer, w = _layer(n, k, g, with_mins, scale_dtype, bias=True)
    x = torch.randn(M, k, generator=torch.Generator().manual_seed(1))
    _assert_fp32(layer(x), x, w, layer.bias)
    layer.bias = None
    _assert_bf16(layer(x.bfloat16()), x, w)
    y3 = layer(x.bfloat16().view(2, M // 2, k))  # [batch, tokens, K] inputs
    assert y3.shape == (2, M // 2, n) and torch.equal(y3.view(M, n), layer(x.bfloat16()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_cover_ragged_rows(monkeypatch, dtype):
    """A weight larger than the scratch budget: 307 rows in blocks of at most 100, evened out
    to 77 + 77 + 77 + 76, each GEMM writing into its columns of the result."""
    k = 64
    monkeypatch.setattr(cpu_prefill, "MAX_BLOCK_BYTES", 100 * k * dtype.itemsize)
    layer, w = _layer(307, k, 32, True, torch.float16)
    assert cpu_prefill.block_rows(307, k, dtype) == 100
    x = torch.randn(M, k, generator=torch.Generator().manual_seed(2))
    y = layer(x.to(dtype))
    (_assert_bf16 if dtype == torch.bfloat16 else _assert_fp32)(y, x, w)


def test_decode_rows_stay_on_the_matmul_kernel():
    layer, _ = _layer(40, 64, 16, True, torch.float16)
    x = torch.randn(kernels.CPU_MAX_ROWS, 64)
    want = kernels.int8_matmul(x, layer.qweight, layer.scales, layer.mins, 16)
    assert torch.equal(layer(x), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_path_without_cpp_kernels(monkeypatch, dtype):
    """No C++ kernels (``_cpu_kernel_rows()`` 0): every row count dequantizes with PyTorch
    ops and multiplies in fp32 (a bf16 result is that rounded once)."""
    monkeypatch.setattr(native, "_cpu_kernel_rows", lambda: 0)
    monkeypatch.setattr(cpu, "int8_dequantize", None)  # must not be reached
    layer, w = _layer(70, 96, 32, False, torch.float32)
    for rows in (3, M):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
        y = layer(x.to(dtype))
        if dtype == torch.float32:
            _assert_fp32(y, x, w)
        else:
            _assert_bf16(y, x, w, weights_bf16=False)


def test_no_per_layer_buffer():
    """Prefill leaves the layers holding their weights alone (the method keeps no tensor);
    layers of different shapes share one scratch (C++ or PyTorch path alike)."""
    a, _ = _layer(48, 64, 32, True, torch.float16)
    b, _ = _layer(64, 128, 16, False, torch.float32)
    for layer in (a, b):
        layer(torch.randn(M, layer.in_features).bfloat16())
        method = layer.quant_method
        assert not [v for v in vars(method).values() if isinstance(v, torch.Tensor)]
        held = sum(t.numel() * t.element_size() for t in layer.buffers())
        assert held == method.weight_bytes(layer.out_features, layer.in_features, torch.float32)
    before = cpu_prefill.scratch(0)
    a(torch.randn(M, 64))
    assert cpu_prefill.scratch(0) is before  # large enough already: reused, not reallocated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_channel_int8_prefill(dtype):
    """``--quant int8`` layers (``Int8LinearMethod``, per channel, bf16 scales on CPU): prefill
    rows go through the same row blocks (where the C++ kernels are built) with the weights
    ``q * scale`` of the scales they hold; decode rows stay on ``_weight_int8pack_mm``."""
    from localchat.engine.quant.methods import Int8LinearMethod

    torch.manual_seed(0)
    layer = Linear(96, 40)
    layer.weight.data.normal_()
    layer.quant_method = Int8LinearMethod("cpu")
    layer.quant_method.quantize_weights(layer)
    layer.process_weights_after_loading()
    assert layer.scales.dtype == torch.bfloat16
    w = reference.dequantize_int8(layer.qweight, layer.scales.float())
    x = torch.randn(M, 96)
    y = layer(x.to(dtype))
    if not cpu.available():  # int8pack: bf16 x times q, scaled, rounded to bf16
        _assert_bf16(y.bfloat16(), x, w, weights_bf16=False)
    elif dtype == torch.bfloat16:  # bf16 blocks: q * scale rounded to bf16
        _assert_bf16(y, x, w, weights_bf16=True)
    else:
        _assert_fp32(y, x, w)
    small = x[:3].to(dtype)
    want = torch.ops.aten._weight_int8pack_mm(small.bfloat16(), layer.qweight, layer.scales)
    assert torch.equal(layer(small), want.to(dtype))


def test_scratch_is_per_thread():
    """Two engines stepping in two threads never write into one buffer."""
    import threading

    mine = cpu_prefill.scratch(1024)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(cpu_prefill.scratch(1024)))
    t.start()
    t.join()
    assert cpu_prefill.scratch(1024) is mine
    assert theirs[0].data_ptr() != mine.data_ptr()


@pytest.mark.parametrize("blocks", [False, True])
def test_shared_dequantization_fills_each_weight_once(monkeypatch, blocks):
    """Inside ``shared_dequantization`` (a CPU step's long prompt forwards run a layer at a
    time) each weight block is dequantized once, however many calls read it, and every call
    gives the bits it gives alone; outside it, every call fills the scratch again. In one
    block and in blocks of at most 100 rows (C++ or PyTorch path alike)."""
    k = 64
    if blocks:
        monkeypatch.setattr(cpu_prefill, "MAX_BLOCK_BYTES", 100 * k * 2)
    layer, _ = _layer(307, k, 32, True, torch.float16)
    xs = [torch.randn(M + i, k, generator=torch.Generator().manual_seed(i)).bfloat16()
          for i in range(3)]
    alone = [layer(x) for x in xs]
    fills = []
    real = cpu_prefill._weight_block

    def counting(key, a, b, k, dt, fill):
        def counted(a, b, w):
            fills.append(b)
            fill(a, b, w)
        return real(key, a, b, k, dt, counted)

    monkeypatch.setattr(cpu_prefill, "_weight_block", counting)
    with cpu_prefill.shared_dequantization():
        together = [layer(x) for x in xs]
    assert sum(fills) == 307 and len(fills) == (4 if blocks else 1)
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    fills.clear()
    for x in xs:
        layer(x)
    assert sum(fills) == 3 * 307
