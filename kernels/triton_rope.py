"""Triton rotary embedding, neox layout (Su et al. 2021, arXiv 2104.09864).

One program per token reads its position's ``cos | sin`` row from ``cos_sin_cache`` (any
scaling, e.g. Llama 3's, is already baked into the cache by ``RotaryEmbedding``) and rotates
every query and key head: dim ``i`` pairs with ``i + head_dim / 2``. Maths in fp32, results
rounded to the input dtype, as in ``kernels.reference.apply_rope``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import check, check_dtype, check_inner_contiguous, check_same_device, next_pow2


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_src, stride_dst, tok, cos, sin, num_heads,
                  HALF: tl.constexpr, HEADS_P: tl.constexpr, HALF_P: tl.constexpr):
    h = tl.arange(0, HEADS_P)[:, None]
    d = tl.arange(0, HALF_P)[None, :]
    mask = (h < num_heads) & (d < HALF)
    base = h * (2 * HALF) + d
    src = src_ptr + tok * stride_src + base
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + tok * stride_dst + base
    tl.store(dst, (x1 * cos - x2 * sin).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, q_out_ptr, k_out_ptr,
    stride_q, stride_k, stride_qo, stride_ko, stride_cache, num_heads, num_kv_heads,
    HALF: tl.constexpr, HALF_P: tl.constexpr, QH_P: tl.constexpr, KH_P: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, HALF_P)[None, :]
    cmask = d < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + d, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + d, mask=cmask, other=0.0)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr, q_out_ptr, stride_q, stride_qo, tok, cos, sin, num_heads,
                  HALF, QH_P, HALF_P)
    _rotate_heads(k_ptr, k_out_ptr, stride_k, stride_ko, tok, cos, sin, num_kv_heads,
                  HALF, KH_P, HALF_P)


def apply_rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` and ``key`` by position (reference semantics, out of place).

    Args:
        positions: ``[num_tokens]`` int32/int64, each < ``cos_sin_cache.shape[0]``.
        query: ``[num_tokens, num_heads, head_dim]``; key: ``[num_tokens, num_kv_heads,
            head_dim]``; the last two dims contiguous (token stride free).
        cos_sin_cache: ``[max_position, head_dim]`` fp32, cos in the first half, sin in the
            second.

    Returns:
        New contiguous ``(query, key)`` in their input dtypes.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or strides.
    """
    check(query.dim() == 3 and key.dim() == 3 and query.shape[0] == key.shape[0]
          and query.shape[2] == key.shape[2], f"query {tuple(query.shape)} / key "
          f"{tuple(key.shape)} must be [num_tokens, heads, head_dim]")
    head_dim = query.shape[2]
    check(head_dim % 2 == 0 and cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim,
          f"cos_sin_cache {tuple(cos_sin_cache.shape)} must be [max_position, {head_dim}]")
    check(positions.shape == (query.shape[0],) and positions.dtype in (torch.int32, torch.int64),
          f"positions must be int [{query.shape[0]}]")
    check_dtype("query", query)
    check_dtype("key", key)
    check_dtype("cos_sin_cache", cos_sin_cache, (torch.float32,))
    check_same_device(positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    check_inner_contiguous("query", query, 2)
    check_inner_contiguous("key", key, 2)
    check(cos_sin_cache.stride(1) == 1, "cos_sin_cache rows must be contiguous")
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    num_tokens = query.shape[0]
    if num_tokens:
        half = head_dim // 2
        _rope_kernel[(num_tokens,)](
            positions, query, key, cos_sin_cache, q_out, k_out,
            query.stride(0), key.stride(0), q_out.stride(0), k_out.stride(0),
            cos_sin_cache.stride(0), query.shape[1], key.shape[1],
            HALF=half, HALF_P=next_pow2(half), QH_P=next_pow2(query.shape[1]),
            KH_P=next_pow2(key.shape[1]),
        )
    return q_out, k_out
