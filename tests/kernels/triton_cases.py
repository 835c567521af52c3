"""Shared parameters of the Triton kernel tests: the issue's grid and the tolerance table."""

from __future__ import annotations

import torch

# (num_heads, num_kv_heads): MHA, GQA 4:1, GQA 7:1 (a group that is not a power of two)
HEADS = [(4, 4), (8, 2), (14, 2)]
HEAD_DIMS = [64, 128]
BLOCK_SIZES = [16, 32]
DTYPES = [torch.float32, torch.bfloat16]
LONG = 300  # tokens: several tiles and blocks, and split-K partitions

# Kernel vs reference, elementwise |a - b| <= atol + rtol * |b|. fp32 differs only by the
# order of fp32 sums; bf16 differs by a few bf16 ulps (2^-8 relative) from probabilities and
# outputs rounded at different points.
TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """``torch.testing.assert_close`` with the tolerance of ``dtype`` (compared in fp32)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **TOL[dtype])
