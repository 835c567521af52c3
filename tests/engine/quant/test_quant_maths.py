"""Quantize/dequantize round trips, packing layout and quantized linear methods.

References are independent: error bounds derived from each scheme's definition (half a
quantization step), a hand-packed nibble layout, and ``F.linear`` over the float weight.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from localchat.engine.layers.linear import Linear
from localchat.engine.quant.fp8 import dequantize_fp8, fp8_linear, quantize_fp8
from localchat.engine.quant.int4 import (
    dequantize_int4,
    pack_int4,
    pick_group_size,
    quantize_int4,
    to_cpu_int4pack,
    unpack_int4,
)
from localchat.engine.quant.int8 import dequantize_int8, quantize_int8
from localchat.engine.quant.methods import make_linear_method
from localchat.engine.quant.schemes import (
    QuantScheme,
    default_float_dtype,
    fp8_supported,
    resolve_scheme,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _weight(n=96, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[3] = 0.0  # an all-zero row
    w[5, 7] = 1.5  # an outlier
    return w


def test_int8_round_trip_within_half_step():
    w = _weight()
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and s.shape == (w.shape[0],)
    assert int(q.abs().max()) <= 127
    err = (dequantize_int8(q, s) - w).abs()
    assert (err <= s[:, None] / 2 + 1e-7).all()
    # absmax maps to +-127 exactly on every nonzero row
    nonzero = w.abs().amax(1) > 0
    assert torch.equal(q.abs().amax(1)[nonzero], torch.full((int(nonzero.sum()),), 127,
                                                            dtype=torch.int8))
    assert (dequantize_int8(q, s)[3] == 0).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_within_half_step(group_size):
    w = _weight()
    q, s, z = quantize_int4(w, group_size)
    groups = w.shape[1] // group_size
    assert q.dtype == torch.uint8 and q.shape == (w.shape[0], w.shape[1] // 2)
    assert s.shape == z.shape == (w.shape[0], groups)
    step = s.repeat_interleave(group_size, dim=1)
    err = (dequantize_int4(q, s, z) - w).abs()
    assert (err <= step / 2 + 1e-6).all()
    # the group minimum and maximum are reproduced (mins = the group minimum)
    wg = w.reshape(w.shape[0], groups, group_size)
    dq = dequantize_int4(q, s, z).reshape_as(wg)
    torch.testing.assert_close(dq.amin(-1), wg.amin(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(dq.amax(-1), wg.amax(-1), atol=1e-6, rtol=0)


def test_int4_nibble_order_low_is_even_k():
    q = torch.tensor([[1, 2, 3, 4, 15, 0]])
    packed = pack_int4(q)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(unpack_int4(packed), q.to(torch.uint8))
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([[16, 0]]))


def test_int4_dequantize_matches_the_layout_formula():
    """w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G] with q read nibble-wise."""
    w = _weight(8, 64, seed=1)
    q, s, z = quantize_int4(w, 32)
    want = torch.empty(8, 64)
    for n in range(8):
        for k in range(64):
            byte = int(q[n, k // 2])
            nib = byte & 0xF if k % 2 == 0 else byte >> 4
            want[n, k] = nib * s[n, k // 32] + z[n, k // 32]
    torch.testing.assert_close(dequantize_int4(q, s, z), want, atol=1e-6, rtol=0)


def test_pick_group_size():
    assert pick_group_size(4096) == 128
    assert pick_group_size(576) == 64
    assert pick_group_size(96) == 32
    assert pick_group_size(80) is None
    assert pick_group_size(4096, 64) == 64


def test_cpu_int4pack_repack_reproduces_our_weights():
    w = _weight(64, 256, seed=2)
    q, s, z = quantize_int4(w, 128)
    packed, sz = to_cpu_int4pack(q, s, z, torch.float32)
    eye = torch.eye(256)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, 128, sz).t()
    torch.testing.assert_close(got, dequantize_int4(q, s, z), atol=1e-5, rtol=0)


def test_fp8_round_trip_relative_error():
    w = _weight()
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn
    dq = dequantize_fp8(q, s)
    # e4m3: 3 mantissa bits -> relative error <= 2**-4 for normal values; subnormals
    # (below 2**-6 of the row scale) are spaced 2**-9 apart
    bound = torch.maximum(w.abs() * 2**-4, s[:, None] * 2**-10)
    assert ((dq - w).abs() <= bound + 1e-9).all()


def _layer(w, bias, scheme, kernel, device="cpu"):
    layer = Linear(w.shape[1], w.shape[0], bias=bias is not None)
    layer.weight.data.copy_(w)
    if bias is not None:
        layer.bias.data.copy_(bias)
    layer.quant_method = make_linear_method(scheme, device, w.shape[1], 128, kernel)
    layer.quant_method.quantize_weights(layer)
    layer.process_weights_after_loading()
    return layer


@pytest.mark.parametrize("scheme", [QuantScheme.INT8, QuantScheme.INT4])
@pytest.mark.parametrize("kernel", ["packed", "dequant"])
@pytest.mark.parametrize("num_tokens", [1, 7])
def test_quantized_linear_matches_float_reference(scheme, kernel, num_tokens):
    w = _weight(96, 256, seed=3)
    bias = torch.randn(96) * 0.1
    x = torch.randn(num_tokens, 256)
    layer = _layer(w, bias, scheme, kernel)
    got = layer(x)
    # the same quantized weights, dequantized by the layout formula, through F.linear
    if scheme is QuantScheme.INT8:
        wq = dequantize_int8(*quantize_int8(w))
    else:
        wq = dequantize_int4(*quantize_int4(w, 128))
    want = F.linear(x, wq, bias)
    # the packed CPU kernels take bf16 activations and return bf16 (relative 2**-8 each)
    tol = 3e-2 if kernel == "packed" else 1e-5
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= tol * scale
    # and the quantized layer stays close to the float layer (quantization error only)
    rel = (got - F.linear(x, w, bias)).norm() / F.linear(x, w, bias).norm()
    assert rel < (0.02 if scheme is QuantScheme.INT8 else 0.15)


def test_schemes_offered_per_device():
    assert resolve_scheme("auto", "cpu") is QuantScheme.NONE
    assert resolve_scheme("INT4", "cpu") is QuantScheme.INT4
    with pytest.raises(ValueError, match="fp8"):
        resolve_scheme("fp8", "cpu")
    with pytest.raises(ValueError, match="unknown quantization"):
        resolve_scheme("int3", "cpu")
    assert default_float_dtype("cuda") is torch.bfloat16
    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert default_float_dtype("cpu") is (torch.bfloat16 if native else torch.float32)


@pytest.mark.skipif(not fp8_supported("cuda"), reason="fp8 needs CUDA compute capability 8.9+")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_fp8_scaled_mm_matches_dequantized_reference(m, dtype):
    w = _weight(256, 512, seed=4).cuda()
    x = torch.randn(m, 512, device="cuda", dtype=dtype)
    q, s = quantize_fp8(w)
    got = fp8_linear(x, q, s)
    assert got.dtype is dtype and got.shape == (m, 256)
    got = got.float()
    want = F.linear(x.float(), dequantize_fp8(q, s))
    # activations are rounded to e4m3 too: relative error ~ 2**-4 per product, averaged
    assert (got - want).norm() / want.norm() < 0.05


def test_layouts_agree_with_the_kernels_reference():
    """``localchat.kernels.reference`` implements the agreed layouts independently."""
    from localchat.kernels import reference

    w = _weight(64, 256, seed=5)
    x = torch.randn(5, 256)
    q8, s8 = quantize_int8(w)
    torch.testing.assert_close(reference.int8_matmul(x, q8, s8),
                               F.linear(x, dequantize_int8(q8, s8)), atol=1e-5, rtol=1e-5)
    q4, s4, m4 = quantize_int4(w, 64)  # w = q * scale + min
    torch.testing.assert_close(reference.int4_matmul(x, q4, s4, m4, 64),
                               F.linear(x, dequantize_int4(q4, s4, m4)), atol=1e-5, rtol=1e-5)
