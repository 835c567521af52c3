"""Paged attention layer: writes this step's K/V into the cache, then attends through it."""

from __future__ import annotations

import torch
from torch import nn

from localchat import kernels

from ..attention_metadata import AttentionMetadata


class Attention(nn.Module):
    """Multi-head / grouped-query attention over a paged KV cache.

    ``forward(q [num_tokens, num_heads * head_dim], k, v [num_tokens, num_kv_heads * head_dim]
    (or already ``[num_tokens, heads, head_dim]``),
    kv_cache [2, num_blocks, block_size, num_kv_heads, head_dim], attn_metadata)`` returns
    ``[num_tokens, num_heads * head_dim]``. Decode-only steps use ``paged_attention_decode``;
    steps with longer query chunks use ``prefill_attention`` (which also covers a cached prefix).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self._kv_source: torch.Tensor | None = None  # the cache _kv_views were made from
        self._kv_views: tuple[torch.Tensor, torch.Tensor] = ()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        if q.dim() == 2:  # callers that already hold [num_tokens, heads, head_dim] skip this
            q = q.view(num_tokens, self.num_heads, self.head_dim)
            k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
            v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        key_cache, value_cache = self._cache_views(kv_cache)
        kernels.store_kv_cache(k, v, key_cache, value_cache, attn_metadata.slot_mapping)
        if attn_metadata.is_decode_only:
            out = kernels.paged_attention_decode(
                q, key_cache, value_cache, attn_metadata.block_tables,
                attn_metadata.seq_lens, self.scale, max_seq_len=attn_metadata.max_seq_len,
            )
        else:
            out = kernels.prefill_attention(
                q, key_cache, value_cache, attn_metadata.query_start_loc,
                attn_metadata.seq_lens, attn_metadata.block_tables, self.scale,
                max_query_len=attn_metadata.max_query_len,
            )
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def _cache_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key_cache, value_cache)``, the two ``[num_blocks, block_size, num_kv_heads,
        head_dim]`` halves of ``kv_cache``, made once per cache tensor (the pool is
        allocated once; indexing it every layer of every step cost two ``select`` ops)."""
        if kv_cache is not self._kv_source:
            self._kv_source = kv_cache
            self._kv_views = (kv_cache[0], kv_cache[1])
        return self._kv_views
