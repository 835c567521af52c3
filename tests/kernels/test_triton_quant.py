"""Triton int8 / int4 weight-only matmuls on the shared layout contract against
``kernels.reference``: M (decode 1, odd 3, 16, prefill 33), N not a multiple of the tile, K not
a multiple of BLOCK_K (per-channel int8), int8 groups 16/32/K with and without mins, int4
groups 32 and 128, scales in fp32 and in the activation dtype, activations fp32 and bf16;
split-K against the single pass; rows of an M-row call equal 1-row calls bit for bit.

On a GPU in bf16 the kernel dequantizes each weight to bf16 before the dot (as GPTQ/AWQ-style
kernels do) while the reference dequantizes in fp32, and the interpreter truncates its final
fp32 -> bf16 cast; outputs that nearly cancel then differ by more than an elementwise bf16
tolerance, so the bound is relative to the output's scale (``max |ref|``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from localchat.kernels import reference, triton_quant

from .test_quant_matmul import quantize_int4, quantize_int8
from .triton_cases import DTYPES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCALED_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """``max |out - ref| <= tol[dtype] * max |ref|``, same dtype and shape."""
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    err = (out.float().cpu() - ref.float()).abs().max().item()
    assert err <= SCALED_TOL[dtype] * ref.float().abs().max().item(), err


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 3, 33])
@pytest.mark.parametrize("group_size, asymmetric, k", [
    (200, False, 200),  # per channel, K not a multiple of BLOCK_K
    (16, False, 128), (32, True, 128), (128, True, 128)])
def test_triton_int8_matmul_equals_reference(m, group_size, asymmetric, k, dtype, device):
    gen = torch.Generator().manual_seed(m + group_size)
    n = 72  # not a multiple of the 64-wide tile
    q, s, mins = quantize_int8(torch.randn(n, k, generator=gen), group_size, asymmetric)
    x = torch.randn(m, k, generator=gen).to(dtype)
    dev = lambda t: None if t is None else t.to(device)
    out = triton_quant.int8_matmul(dev(x), dev(q), dev(s), dev(mins), group_size)
    assert_close_scaled(out, reference.int8_matmul(x, q, s, mins, group_size), dtype)
    if group_size == k and not asymmetric:  # per channel: [N] scales read the same
        out1 = triton_quant.int8_matmul(dev(x), dev(q), dev(s[:, 0]))
        assert torch.equal(out1, out)


def test_triton_int8_scales_in_activation_dtype(device):
    gen = torch.Generator().manual_seed(7)
    q, s, mins = quantize_int8(torch.randn(64, 64, generator=gen), 32, True)
    x = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    s, mins = s.to(torch.bfloat16), mins.to(torch.bfloat16)
    out = triton_quant.int8_matmul(x.to(device), q.to(device), s.to(device), mins.to(device))
    assert_close_scaled(out, reference.int8_matmul(x, q, s, mins), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_triton_int4_matmul_equals_reference(m, group_size, dtype, device):
    gen = torch.Generator().manual_seed(m + group_size)
    n, k = 72, 256
    packed, s, mins, _ = quantize_int4(torch.randn(n, k, generator=gen), group_size)
    s, mins = s.to(dtype), mins.to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    out = triton_quant.int4_matmul(x.to(device), packed.to(device), s.to(device),
                                   mins.to(device), group_size)
    assert_close_scaled(out, reference.int4_matmul(x, packed, s, mins, group_size), dtype)


@pytest.mark.parametrize("op", ["int8", "int4"])
def test_split_k_is_deterministic_and_batch_invariant(op, device):
    """K = 1024 splits in 4 (the reduction is a fixed-order sum, not atomics): equals the
    single-pass result within fp32 rounding, and every row of the 16-row call equals its
    1-row call bit for bit, split or not. Bit for bit on the GPU only: the CPU interpreter
    computes ``tl.dot`` with ``np.matmul``, whose OpenBLAS may round a tile's rows with
    different micro-kernels by their position (on AMD Zen rows 12-15 of a 16-row tile differ
    from row 0 in the last bit), so there a row only agrees within fp32 rounding."""
    gen = torch.Generator().manual_seed(3)
    n, k = 64, 1024
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(16, k, generator=gen).to(device)
    if op == "int8":
        q, s, mins = quantize_int8(w, 32, True)
        args = (q.to(device), s.to(device), mins.to(device), 32)
        fn = triton_quant.int8_matmul
    else:
        packed, s, mins, _ = quantize_int4(w, 32)
        args = (packed.to(device), s.to(device), mins.to(device), 32)
        fn = triton_quant.int4_matmul
    assert triton_quant.plan_blocks(16, n, k, 32, torch.device(device))[2] > 1
    split = fn(x, *args, split_k=4)
    single = fn(x, *args, split_k=1)
    torch.testing.assert_close(split, single, atol=1e-4, rtol=1e-5)
    for split_k in (None, 4, 1):
        full = fn(x, *args, split_k=split_k)
        assert torch.equal(fn(x, *args, split_k=split_k), full)  # deterministic
        for i in (0, 5, 15):
            row = fn(x[i: i + 1], *args, split_k=split_k)[0]
            if torch.device(device).type == "cuda":
                assert torch.equal(row, full[i])
            else:
                torch.testing.assert_close(row, full[i], atol=1e-4, rtol=1e-5)


def test_triton_int4_rejects_unsupported_group(device):
    with pytest.raises(ValueError, match="group_size"):
        triton_quant.int4_matmul(torch.randn(1, 64, device=device),
                                 torch.zeros(8, 32, dtype=torch.uint8, device=device),
                                 torch.ones(8, 4, device=device), torch.ones(8, 4, device=device),
                                 group_size=16)
