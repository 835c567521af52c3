"""Triton varlen causal prefill attention over a paged, partly cached context.

Sequence ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]``: its last ``q_len``
positions out of ``seq_lens[i]`` tokens whose K/V (the new ones included, written by
``store_kv_cache`` first) are read through the block table. One program per
``(sequence, query slice, kv_head)`` holds the slice's rows for the KV head's whole group of
query heads (GQA: each K/V tile is loaded once per group) and streams K/V tiles of
``BLOCK_N`` tokens with an online softmax and a causal mask on absolute positions
(FlashAttention-2 tiling, Dao 2023, arXiv 2307.08691). The same kernel serves chunked prefill
over a cached prefix (prefix caching, multi-turn chat) and speculative verification (``k + 1``
query rows per sequence). Reference: ``kernels.reference.prefill_attention``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import (
    check,
    check_dtype,
    check_inner_contiguous,
    check_same_device,
    fp32_dot,
    next_pow2,
)

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, qsl_ptr, seq_lens_ptr, bt_ptr, out_ptr,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh, sm_scale_log2,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, D_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    # Row r of the [BLOCK_M, D_P] query tile is token r // GROUP_P of this program's
    # TOK_M-token slice and query head kvh * GROUP + r % GROUP_P: the KV head's whole group
    # shares every K/V tile it loads.
    TOK_M: tl.constexpr = BLOCK_M // GROUP_P
    seq = tl.program_id(0).to(tl.int64)
    mb = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq).to(tl.int32)
    q_len = tl.load(qsl_ptr + seq + 1).to(tl.int32) - q_start
    if mb * TOK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx = seq_len - q_len  # cached tokens before this chunk
    r = tl.arange(0, BLOCK_M)
    tok = mb * TOK_M + r // GROUP_P
    g = r % GROUP_P
    head = kvh * GROUP + g
    d = tl.arange(0, D_P)
    mmask = (tok < q_len) & (g < GROUP)
    dmask = d < HEAD_DIM
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=mmask[:, None] & dmask[None, :], other=0.0)
    q_pos = ctx + tok
    m = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_P], dtype=tl.float32)
    kv_end = tl.minimum(seq_len, ctx + (mb + 1) * TOK_M)
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < kv_end
        blk = tl.load(bt_ptr + seq * stride_bt + pos // BLOCK_SIZE, mask=pmask, other=0)
        blk = blk.to(tl.int64)
        in_blk = (pos % BLOCK_SIZE).to(tl.int64)
        kvmask = pmask[:, None] & dmask[None, :]
        k_off = blk * stride_kb + in_blk * stride_ks + kvh * stride_kh
        k = tl.load(kc_ptr + k_off[:, None] + d[None, :], mask=kvmask, other=0.0)
        # FP32_DOT: fp32 operands, ieee dot (see _triton_common; the interpreter's bf16 dot
        # is broken); else the native (bf16 tensor-core) dot. fp32 accumulation either way.
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k).to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = pmask[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v_off = blk * stride_vb + in_blk * stride_vs + kvh * stride_vh
        v = tl.load(vc_ptr + v_off[:, None] + d[None, :], mask=kvmask, other=0.0)
        p = p.to(v.dtype)  # as FlashAttention: probabilities in the value dtype for P @ V
        if FP32_DOT:
            acc = tl.dot(p.to(tl.float32), v.to(tl.float32), acc * alpha[:, None],
                         input_precision="ieee")
        else:
            acc = tl.dot(p, v, acc * alpha[:, None])
        m = m_new
    out = acc / tl.maximum(l_sum, 1e-30)[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention of query chunks over their cached context (reference
    semantics).

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` fp32/fp16/bf16, last dim contiguous.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the
            query's dtype, holding every token of each sequence (chunk included).
        query_start_loc: ``[num_seqs + 1]`` int cumulative query lengths (tokens).
        seq_lens: ``[num_seqs]`` int total tokens (cached prefix + chunk) per sequence.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]`` int32/int64.
        scale: softmax scale.
        max_query_len: longest chunk (tokens); ``None`` reads it from ``query_start_loc``
            (one device-to-host copy). Pass it to stay sync-free.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in the query's dtype.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or strides.
    """
    check(query.dim() == 3 and key_cache.dim() == 4 and key_cache.shape == value_cache.shape,
          "query must be [num_tokens, num_heads, head_dim]; caches "
          "[num_blocks, block_size, num_kv_heads, head_dim]")
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    num_seqs = seq_lens.shape[0]
    check(cache_head_dim == head_dim and num_heads % num_kv_heads == 0,
          f"query {tuple(query.shape)} does not fit cache {tuple(key_cache.shape)}")
    check(query_start_loc.shape == (num_seqs + 1,) and block_tables.dim() == 2
          and block_tables.shape[0] == num_seqs and seq_lens.dim() == 1,
          f"query_start_loc {tuple(query_start_loc.shape)}, seq_lens "
          f"{tuple(seq_lens.shape)}, block_tables {tuple(block_tables.shape)} disagree")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens),
                    ("block_tables", block_tables)):
        check(t.dtype in (torch.int32, torch.int64), f"{name} must be int32/int64")
    check_dtype("query", query)
    check(query.dtype == key_cache.dtype == value_cache.dtype,
          f"dtypes differ: query {query.dtype}, cache {key_cache.dtype}/{value_cache.dtype}")
    check_same_device(query=query, key_cache=key_cache, value_cache=value_cache,
                      query_start_loc=query_start_loc, seq_lens=seq_lens,
                      block_tables=block_tables)
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_inner_contiguous(name, t, 1)
    check(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out
    group = num_heads // num_kv_heads
    group_p = next_pow2(group)
    # 64 rows (tokens x group heads) per program; 16 for short chunks (speculative
    # verification, decode-like rows) so that little of the tile is padding.
    block_m = max(group_p, 16 if max_query_len * group_p <= 16 else 64)
    grid = (num_seqs, triton.cdiv(max_query_len, block_m // group_p), num_kv_heads)
    _prefill_kernel[grid](
        query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, out,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1),
        key_cache.stride(2), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E,
        GROUP=group, GROUP_P=group_p, HEAD_DIM=head_dim, D_P=max(16, next_pow2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=64, FP32_DOT=fp32_dot(query.dtype),
    )
    return out
