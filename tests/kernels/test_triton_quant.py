"""Triton int8 / int4 weight-only matmuls against ``kernels.reference`` over M (decode 1, odd 3,
prefill 33), N not a multiple of the tile, K not a multiple of BLOCK_K (int8), group sizes 32
and 128, scales in fp32 and in the activation dtype, activations fp32 and bf16.

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
@pytest.mark.parametrize("scale_dtype", ["fp32", "act"])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_triton_int8_matmul_equals_reference(m, scale_dtype, dtype, device):
    gen = torch.Generator().manual_seed(m)
    n, k = 72, 200  # N not a multiple of the 64-wide tile, K not a multiple of BLOCK_K
    q, s = quantize_int8(torch.randn(n, k, generator=gen))
    if scale_dtype == "act":
        s = s.to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    out = triton_quant.int8_matmul(x.to(device), q.to(device), s.to(device))
    assert_close_scaled(out, reference.int8_matmul(x, q, s), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_triton_int4_matmul_equals_reference(m, group_size, dtype, device):
    gen = torch.Generator().manual_seed(m + group_size)
    n, k = 72, 256
    packed, s, z, _ = quantize_int4(torch.randn(n, k, generator=gen), group_size)
    s, z = s.to(dtype), z.to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    out = triton_quant.int4_matmul(x.to(device), packed.to(device), s.to(device), z.to(device),
                                   group_size)
    assert_close_scaled(out, reference.int4_matmul(x, packed, s, z, group_size), dtype)


def test_triton_int4_rejects_unsupported_group(device):
    with pytest.raises(ValueError, match="group_size"):
        triton_quant.int4_matmul(torch.randn(1, 64, device=device),
                                 torch.zeros(8, 32, dtype=torch.uint8, device=device),
                                 torch.ones(8, 4, device=device), torch.ones(8, 4, device=device),
                                 group_size=16)
