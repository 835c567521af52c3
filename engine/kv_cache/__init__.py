"""Paged KV cache: block pool, per-request block lists, and the device tensors."""

from __future__ import annotations

import torch

from .block_pool import BlockPool, KVCacheBlock
from .manager import KVCacheManager


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensor per layer.

    Uninitialized: attention only reads slots that were written (``seq_lens`` bounds it).
    Their bytes: ``memory.footprint.kv_bytes``.
    """
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    return [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]


__all__ = ["BlockPool", "KVCacheBlock", "KVCacheManager", "allocate_kv_caches"]
