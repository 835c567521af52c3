"""Triton ``store_kv_cache``: scatter this step's K/V rows into the paged cache.

One program per token copies its ``num_kv_heads * head_dim`` key and value elements to slot
``slot_mapping[t]`` (``block_id * block_size + offset``); slot ``-1`` (padding) writes nothing.
Reference: ``kernels.reference.store_kv_cache``; design after vLLM's ``reshape_and_cache``
(Kwon et al. 2023, arXiv 2309.06180).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import check, check_dtype, check_inner_contiguous, check_same_device, next_pow2


@triton.jit
def _store_kv_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    stride_k_tok, stride_v_tok, stride_kc_slot, stride_vc_slot,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.where(slot >= 0, ROW, 0)  # a padding token (slot -1) moves nothing
    k = tl.load(key_ptr + tok.to(tl.int64) * stride_k_tok + offs, mask=mask)
    v = tl.load(value_ptr + tok.to(tl.int64) * stride_v_tok + offs, mask=mask)
    tl.store(key_cache_ptr + slot * stride_kc_slot + offs, k, mask=mask)
    tl.store(value_cache_ptr + slot * stride_vc_slot + offs, v, mask=mask)


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V into the paged cache, in place (same contract as the reference).

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]`` in the cache's dtype; the last two
            dims must be contiguous (the token stride is free, e.g. a slice of a fused qkv).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the last
            three dims contiguous.
        slot_mapping: ``[num_tokens]`` int32/int64 flat slot per token; ``-1`` skips a token.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or strides.
    """
    check(key.dim() == 3 and key.shape == value.shape, f"key {tuple(key.shape)} and value "
          f"{tuple(value.shape)} must be equal [num_tokens, num_kv_heads, head_dim]")
    check(key_cache.dim() == 4 and key_cache.shape == value_cache.shape,
          "key_cache/value_cache must be equal [num_blocks, block_size, num_kv_heads, head_dim]")
    check(tuple(key.shape[1:]) == tuple(key_cache.shape[2:]),
          f"key {tuple(key.shape)} does not match cache {tuple(key_cache.shape)}")
    check(slot_mapping.shape == (key.shape[0],), f"slot_mapping {tuple(slot_mapping.shape)} "
          f"must be [{key.shape[0]}]")
    check(slot_mapping.dtype in (torch.int32, torch.int64), "slot_mapping must be int32/int64")
    check_dtype("key_cache", key_cache)
    check(key.dtype == value.dtype == key_cache.dtype == value_cache.dtype,
          f"dtypes differ: key {key.dtype}, value {value.dtype}, cache {key_cache.dtype}")
    check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                      slot_mapping=slot_mapping)
    for name, t, n in (("key", key, 2), ("value", value, 2), ("key_cache", key_cache, 3),
                       ("value_cache", value_cache, 3)):
        check_inner_contiguous(name, t, n)
    check(key_cache.stride(0) == key_cache.shape[1] * key_cache.stride(1)
          and value_cache.stride(0) == value_cache.shape[1] * value_cache.stride(1),
          "cache blocks must be packed (slot = block_id * block_size + offset)")
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    row = key.shape[1] * key.shape[2]
    _store_kv_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), value.stride(0), key_cache.stride(1), value_cache.stride(1),
        ROW=row, BLOCK=next_pow2(row),
    )
