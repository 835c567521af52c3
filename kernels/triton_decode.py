"""Triton paged decode attention: one query token per sequence over its paged KV cache.

GQA-aware: one program per ``(sequence, kv_head[, partition])`` loads the KV head's keys and
values once for its whole group of query heads (the group's queries are the rows of one
``[GROUP_P, head_dim]`` tile, so QK^T and PV are tensor-core dots). Tokens are read in tiles of
``BLOCK_N`` through the block table (``slot = block_table[t // block_size] * block_size +
t % block_size``), with an online softmax (Milakov & Gimelshein 2018, arXiv 1805.02867; as in
FlashAttention, Dao et al. 2022, arXiv 2205.14135). The split-K variant ("flash decoding",
vLLM's paged attention v2) cuts each sequence into partitions processed by separate programs,
then a reduce kernel merges their partial outputs by their log-sum-exp weights; it keeps the GPU
busy when ``num_seqs * num_kv_heads`` is small and contexts are long.

The launcher never reads device values on the host (no sync), so it can be captured in a CUDA
graph: the longest possible sequence is bounded by the caller's ``max_seq_len`` (a length
bucket of the real longest sequence, so a 4k context on a 128k table still gets enough
partitions to fill the GPU), else by ``block_tables.shape[1] * block_size``.
Reference: ``kernels.reference.paged_attention_decode``.
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
BLOCK_N = 64  # tokens per tile
MAX_SPLITS = 64  # partitions per sequence at most (the reduce holds them in registers)
MIN_PARTITION = 512  # tokens


@triton.jit
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_ml_ptr,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_os, stride_oh, sm_scale_log2, num_splits, partition,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, D_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    if SPLIT:
        start = split * partition
        end = tl.minimum(seq_len, start + partition)
    else:
        start = 0
        end = seq_len
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, D_P)
    head = kvh * GROUP + g
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + head[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    m = tl.full([GROUP_P], -1.0e30, dtype=tl.float32)
    l_sum = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([GROUP_P, D_P], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < end
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
        s = tl.where(pmask[None, :], s * sm_scale_log2, float("-inf"))
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
    omask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        # partials: part_out [num_seqs, num_heads, num_splits, D_P] fp32,
        # part_ml [num_seqs, num_heads, num_splits, 2] fp32 (max in log2 units, sum)
        row = (seq * (tl.num_programs(1) * GROUP) + head) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * D_P + d[None, :], out, mask=omask)
        tl.store(part_ml_ptr + row * 2, m, mask=gmask)
        tl.store(part_ml_ptr + row * 2 + 1, l_sum, mask=gmask)
    else:
        tl.store(out_ptr + seq * stride_os + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _reduce_kernel(
    part_out_ptr, part_ml_ptr, out_ptr, stride_os, stride_oh, num_splits,
    HEAD_DIM: tl.constexpr, D_P: tl.constexpr, SPLITS_P: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_P)
    d = tl.arange(0, D_P)
    smask = sp < num_splits
    row = (seq * tl.num_programs(1) + head) * num_splits + sp
    m = tl.load(part_ml_ptr + row * 2, mask=smask, other=-1.0e30)
    lse = tl.load(part_ml_ptr + row * 2 + 1, mask=smask, other=0.0)
    o = tl.load(part_out_ptr + row[:, None] * D_P + d[None, :], mask=smask[:, None], other=0.0)
    w = lse * tl.exp2(m - tl.max(m, axis=0))
    out = tl.sum(w[:, None] * o, axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (128 off CUDA, for interpreter runs)."""
    if device.type != "cuda":
        return 128
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int,
                       device: torch.device) -> int:
    """Partitions per sequence: 1 (single pass) unless the ``num_seqs * num_kv_heads``
    programs would leave most of the GPU's SMs idle and ``max_seq_len`` (tokens) spans
    several ``MIN_PARTITION``-token partitions."""
    if max_seq_len <= MIN_PARTITION:
        return 1
    sms = sm_count(device)
    programs = num_seqs * num_kv_heads
    if programs >= sms:
        return 1
    want = min(triton.cdiv(2 * sms, programs), triton.cdiv(max_seq_len, MIN_PARTITION))
    return max(1, min(want, MAX_SPLITS))


def partitioning(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device,
                 num_splits: int | None = None) -> tuple[int, int]:
    """``(num_splits, partition)``: partitions per sequence and tokens per partition (a
    multiple of ``BLOCK_N``) covering ``max_seq_len`` tokens, the bound the caller gives
    (a length bucket of the real longest sequence, else the block table's width)."""
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, max_seq_len, device)
    check(num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    partition = triton.cdiv(triton.cdiv(max_seq_len, num_splits), BLOCK_N) * BLOCK_N
    return triton.cdiv(max_seq_len, partition), partition


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Decode attention (reference semantics) through the paged cache.

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` fp32/fp16/bf16, last dim contiguous.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the
            query's dtype, last dim contiguous.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]`` int32/int64.
        seq_lens: ``[num_seqs]`` int tokens per sequence (query token included), each
            ``<= max_num_blocks_per_seq * block_size``; a 0 gives a zero output row.
        scale: softmax scale.
        num_splits: partitions per sequence (split-K); ``None`` picks one with
            ``default_num_splits``, 1 forces the single-pass kernel.
        max_seq_len: a host-side upper bound of ``seq_lens`` (tokens; a length bucket of
            the real longest sequence, see ``engine.attention_metadata.seq_len_bucket``):
            the partitions cover that many tokens. ``None`` (or more than the table holds):
            the table width ``max_num_blocks_per_seq * block_size``. It must be ``>=``
            every ``seq_lens`` entry (split-K partitions end there).

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query's dtype.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or strides.
    """
    check(query.dim() == 3 and key_cache.dim() == 4 and key_cache.shape == value_cache.shape,
          "query must be [num_seqs, num_heads, head_dim]; caches "
          "[num_blocks, block_size, num_kv_heads, head_dim]")
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    check(cache_head_dim == head_dim and num_heads % num_kv_heads == 0,
          f"query {tuple(query.shape)} does not fit cache {tuple(key_cache.shape)}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
          and seq_lens.shape == (num_seqs,), f"block_tables {tuple(block_tables.shape)} / "
          f"seq_lens {tuple(seq_lens.shape)} must have {num_seqs} rows")
    check(block_tables.dtype in (torch.int32, torch.int64)
          and seq_lens.dtype in (torch.int32, torch.int64), "block_tables/seq_lens must be int")
    check_dtype("query", query)
    check(query.dtype == key_cache.dtype == value_cache.dtype,
          f"dtypes differ: query {query.dtype}, cache {key_cache.dtype}/{value_cache.dtype}")
    check_same_device(query=query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, seq_lens=seq_lens)
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_inner_contiguous(name, t, 1)
    check(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    table_len = block_tables.shape[1] * block_size
    max_seq_len = table_len if max_seq_len is None else max(1, min(int(max_seq_len), table_len))
    num_splits, partition = partitioning(num_seqs, num_kv_heads, max_seq_len, query.device,
                                         num_splits)
    group = num_heads // num_kv_heads
    d_p = max(16, next_pow2(head_dim))
    split = num_splits > 1
    if split:
        part_out = torch.empty(num_seqs * num_heads * num_splits * d_p, dtype=torch.float32,
                               device=query.device)
        part_ml = torch.empty(num_seqs * num_heads * num_splits * 2, dtype=torch.float32,
                              device=query.device)
    else:
        part_out = part_ml = out  # unused
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_ml,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1),
        key_cache.stride(2), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), scale * LOG2E, num_splits,
        partition,
        GROUP=group, GROUP_P=max(16, next_pow2(group)), HEAD_DIM=head_dim, D_P=d_p,
        BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, SPLIT=split, FP32_DOT=fp32_dot(query.dtype),
    )
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            part_out, part_ml, out, out.stride(0), out.stride(1), num_splits,
            HEAD_DIM=head_dim, D_P=d_p, SPLITS_P=next_pow2(num_splits),
        )
    return out
