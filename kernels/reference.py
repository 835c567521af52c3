"""PyTorch reference implementations of the data-plane ops.

These are the CPU paths and the oracles the Triton kernels are tested against. Shapes follow
the README's Architecture table (``engine/kv_cache/``): a layer's KV cache is ``key_cache,
value_cache`` each ``[num_blocks, block_size, num_kv_heads, head_dim]`` (the two halves of the
per-layer ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensor). Token ``t`` of a
sequence lives at slot ``block_table[t // block_size] * block_size + t % block_size``.

References: vLLM's paged attention (Kwon et al. 2023, arXiv 2309.06180); RMSNorm (Zhang &
Sennrich 2019); rotary embeddings, neox layout (Su et al. 2021, arXiv 2104.09864).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V into the paged cache, in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``; another float dtype than the
            cache's is rounded to it (``Tensor.to``: nearest even), as an fp32 engine's fp16
            cache holds its keys.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        slot_mapping: ``[num_tokens]`` int64 flat slot per token; ``-1`` skips a (padding) token.
    """
    num_kv_heads, head_dim = key_cache.shape[-2:]
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)
    flat_v = value_cache.view(-1, num_kv_heads, head_dim)
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    flat_k.index_copy_(0, slot_mapping, key.to(key_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, value.to(value_cache.dtype))


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one sequence's first ``seq_len`` tokens of K/V through its ``block_table``.

    Returns two ``[seq_len, num_kv_heads, head_dim]`` tensors.
    """
    block_size = key_cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    ids = block_table[:num_blocks]
    k = key_cache.index_select(0, ids).flatten(0, 1)[:seq_len]
    v = value_cache.index_select(0, ids).flatten(0, 1)[:seq_len]
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of ``q [q_len, H, D]`` over ``k, v [kv_len, H_kv, D]`` where the queries
    are the last ``q_len`` positions of the ``kv_len`` keys. Returns ``[q_len, H, D]``."""
    q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    if q_len == 1:
        # Decode: the group's query heads share one KV head, so fold them into the query
        # rows ([H_kv, group, D]) and use two batched GEMMs; no K/V copies for GQA, and on CPU
        # this beats SDPA's generic path, whose per-call checks dominate at these sizes.
        qg = q.view(num_kv_heads, group, head_dim)
        scores = torch.bmm(qg, k.permute(1, 2, 0)).float().mul_(scale)  # [H_kv, group, kv_len]
        probs = scores.softmax(dim=-1).to(v.dtype)
        out = torch.bmm(probs, v.transpose(0, 1))  # [H_kv, group, D]
        return out.reshape(1, num_heads, head_dim)
    # Prefill: 4-D inputs select SDPA's fused (flash) kernels, GQA without K/V copies.
    qt = q.transpose(0, 1)[None]  # [1, H, q_len, D]
    kt = k.transpose(0, 1)[None]
    vt = v.transpose(0, 1)[None]
    if q_len == kv_len:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale,
                                             enable_gqa=group > 1)
    else:
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        mask = q_pos[:, None] >= torch.arange(kv_len, device=q.device)[None, :]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale,
                                             enable_gqa=group > 1)
    return out[0].transpose(0, 1)


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence attending to its whole cached sequence.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the
            query's dtype or (under an fp32 query) fp16 / bf16, widened to it exactly.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]`` int32/int64.
        seq_lens: ``[num_seqs]`` tokens per sequence, including the query token.
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query's dtype.
    """
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens.tolist()):
        k, v = gather_kv(key_cache, value_cache, block_tables[i], seq_len)
        out[i] = _attend(query[i : i + 1], k.to(query.dtype), v.to(query.dtype), scale)[0]
    return out


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen attention for query chunks over a cached prefix (chunked prefill, and
    speculative verification of k+1 positions).

    Sequence ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]``; they are its
    last ``q_len_i`` positions out of ``seq_lens[i]`` tokens, whose K/V (the new ones included)
    are already in the cache.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (dtypes
            as for :func:`paged_attention_decode`).
        query_start_loc: ``[num_seqs + 1]`` cumulative query lengths, int.
        seq_lens: ``[num_seqs]`` total tokens (cached prefix + query) per sequence.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]``.
        scale: softmax scale.

    Returns:
        ``[num_tokens, num_heads, head_dim]``.
    """
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        s, e = starts[i], starts[i + 1]
        if e == s:
            continue
        k, v = gather_kv(key_cache, value_cache, block_tables[i], seq_len)
        out[s:e] = _attend(query[s:e], k.to(query.dtype), v.to(query.dtype), scale)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in fp32 and cast back (HF Llama semantics).

    ``x [..., hidden]``, ``weight [hidden]``; returns ``x``'s shape and dtype.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + residual``; returns ``(rms_norm(residual), residual)``.

    Out of place here; the Triton kernel may update ``x`` and ``residual`` in place (callers
    must not reuse their inputs). Shapes ``[num_tokens, hidden]``.
    """
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def apply_rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding, neox layout (rotate halves), over the full head_dim.

    Args:
        positions: ``[num_tokens]`` int64.
        query: ``[num_tokens, num_heads, head_dim]``; key: ``[num_tokens, num_kv_heads, head_dim]``.
        cos_sin_cache: ``[max_position, head_dim]`` fp32: cos in the first half, sin in the
            second (each ``head_dim // 2`` wide).

    Returns:
        Rotated ``(query, key)`` in their input dtypes.
    """
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    cos = cos[:, None, :]
    sin = sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(query), rotate(key)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gating (Shazeer 2020, arXiv 2002.05202): ``x [num_tokens, 2 * I]`` holds
    ``gate | up``; returns ``silu(gate) * up`` ``[num_tokens, I]`` in ``x``'s dtype (the SiLU
    rounded to that dtype before the product, as ``F.silu(gate) * up``)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Float-weight matmul ``x @ weight.T (+ bias)`` computed in fp32, cast to ``x``'s dtype
    (the CPU kernel ``cpu.float_matmul`` sums in another fixed order, so expect fp32
    rounding differences, not equality).

    Args:
        x: ``[M, K]`` fp32/fp16/bf16 activations.
        weight: ``[N, K]`` fp32/fp16/bf16.
        bias: ``[N]`` or ``None``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# The integer-dot (W4A8 / W8A8) references live in reference_a8.py; re-exported here so that
# ``reference.int4_matmul_a8`` and friends keep working.
from .reference_a8 import (  # noqa: F401 (re-exports)
    A8_BLOCK,
    _a8_terms,
    int4_matmul_a8,
    int8_matmul_a8,
    quantize_activations_int8,
)

# The int5 (GGUF Q5_0) references live in reference_int5.py; re-exported here.
from .reference_int5 import (  # noqa: F401 (re-exports)
    _int5_a8_terms,
    dequantize_int5,
    int5_matmul,
    int5_matmul_a8,
    unpack_int5,
)

# The int6 (GGUF Q6_K) references live in reference_int6.py; re-exported here.
from .reference_int6 import (  # noqa: F401 (re-exports)
    _int6_a8_terms,
    dequantize_int6,
    int6_matmul,
    int6_matmul_a8,
    int6_scales,
    unpack_int6,
)

# The int8 / int4 weight-format references live in reference_quant.py; re-exported here.
from .reference_quant import (  # noqa: F401 (re-exports)
    _group_size,
    dequantize_int4,
    dequantize_int8,
    fold_kscales,
    int4_matmul,
    int8_matmul,
    unpack_int4,
)
