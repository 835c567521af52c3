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
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, the cache's dtype.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        slot_mapping: ``[num_tokens]`` int64 flat slot per token; ``-1`` skips a (padding) token.
    """
    num_kv_heads, head_dim = key_cache.shape[-2:]
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)
    flat_v = value_cache.view(-1, num_kv_heads, head_dim)
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    flat_k.index_copy_(0, slot_mapping, key)
    flat_v.index_copy_(0, slot_mapping, value)


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
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]`` int32/int64.
        seq_lens: ``[num_seqs]`` tokens per sequence, including the query token.
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query's dtype.
    """
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens.tolist()):
        k, v = gather_kv(key_cache, value_cache, block_tables[i], seq_len)
        out[i] = _attend(query[i : i + 1], k, v, scale)[0]
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
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
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
        out[s:e] = _attend(query[s:e], k, v, scale)
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


def _group_size(k: int, groups: int, group_size: int | None, op: str) -> int:
    """Columns of K per (scale, min) group; ``None`` means ``K // groups``."""
    g = k // groups if group_size is None and groups > 0 else group_size
    if not g or g <= 0 or k % g or k // g != groups:
        raise ValueError(f"{op}: K={k} is not {groups} groups of {group_size}")
    return g


def dequantize_int8(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """Group-wise int8 weights ``[N, K]`` int8 -> fp32 ``[N, K]``:
    ``w[n, k] = q[n, k] * scales[n, k // G] (+ mins[n, k // G])`` (one rounding in fp32).

    ``scales`` (and ``mins``) are ``[N, K // G]`` fp32; a 1-D ``[N]`` ``scales`` is read as
    per-channel (``G = K``). Raises ``ValueError`` on mismatched shapes or dtypes.
    """
    if scales.dim() == 1:
        scales = scales[:, None]
    if mins is not None and mins.dim() == 1:
        mins = mins[:, None]
    n, k = qweight.shape
    if qweight.dtype != torch.int8 or scales.dim() != 2 or scales.shape[0] != n \
            or (mins is not None and mins.shape != scales.shape):
        raise ValueError(f"int8_matmul: qweight {tuple(qweight.shape)} {qweight.dtype}, "
                         f"scales {tuple(scales.shape)}, mins "
                         f"{None if mins is None else tuple(mins.shape)}")
    g = _group_size(k, scales.shape[1], group_size, "int8_matmul")
    w = qweight.float().view(n, k // g, g) * scales.float()[..., None]
    if mins is not None:
        w = w + mins.float()[..., None]
    return w.view(n, k)


def int8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """Weight-only int8 GEMM, group-wise along K (W8A16; per channel when ``G = K``).

    ``w[n, k] = qweight[n, k] * scales[n, k // G] (+ mins[n, k // G])``; returns ``x @ w.T``
    computed in fp32 and cast to ``x``'s dtype. GGUF Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K map onto
    this layout (their integers fit in int8; ``mins`` for the asymmetric ones).

    Args:
        x: ``[M, K]`` fp32/fp16/bf16 activations.
        qweight: ``[N, K]`` int8.
        scales: ``[N, K // G]`` fp32 (``[N, 1]`` or ``[N]``: per output channel).
        mins: ``[N, K // G]`` fp32 or ``None`` (symmetric).
        group_size: ``G``, columns of K per group; ``None`` = ``K // scales.shape[1]``.

    Returns:
        ``[M, N]`` in ``x.dtype``.

    Raises:
        ValueError: on mismatched shapes or a non-int8 ``qweight``.
    """
    if x.shape[-1] != qweight.shape[-1]:
        raise ValueError(f"int8_matmul: x {tuple(x.shape)}, qweight {tuple(qweight.shape)}")
    w = dequantize_int8(qweight, scales, mins, group_size)
    return (x.float() @ w.t()).to(x.dtype)


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


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """``[N, K // 2]`` uint8 (low nibble = even k, high nibble = odd k) -> ``[N, K]`` uint8
    values in 0..15."""
    low = qweight & 0x0F
    high = qweight >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def fold_kscales(scales: torch.Tensor, mins: torch.Tensor, super_scales: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-level int4 scales ("k-scales": GGUF Q4_K as held in its file) -> the folded fp32
    ``(scales, mins)`` ``[N, K // 32]`` every int4 op reads.

    ``scales`` / ``mins`` uint8 ``[N, K // 32]`` (the 6-bit sub-block scale ``sc`` and min
    ``m`` of each group of 32), ``super_scales`` fp16 ``[N, K // 256, 2]`` (each 256-column
    super-block's ``d`` and ``-dmin``): ``scale = float(d) * sc``, ``min = float(-dmin) * m``,
    exact in fp32 (11 + 6 significant bits). Source: llama.cpp's ``block_q4_K``.
    Raises ``ValueError`` on mismatched shapes or dtypes.
    """
    n, groups = scales.shape
    if scales.dtype != torch.uint8 or mins is None or mins.dtype != torch.uint8 \
            or mins.shape != scales.shape or super_scales.dtype != torch.float16 \
            or groups % 8 or tuple(super_scales.shape) != (n, groups // 8, 2):
        raise ValueError(f"k-scales: scales {tuple(scales.shape)} {scales.dtype}, mins "
                         f"{None if mins is None else (tuple(mins.shape), mins.dtype)}, "
                         f"super_scales {tuple(super_scales.shape)} {super_scales.dtype}")
    sup = super_scales.float().repeat_interleave(8, dim=1)
    return sup[..., 0] * scales.float(), sup[..., 1] * mins.float()


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int,
    super_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-wise int4 weights -> fp32 ``[N, K]``:
    ``w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G]`` (one rounding in fp32).

    ``qweight [N, K // 2]`` uint8 (low nibble = even k); ``scales, mins [N, K // G]``, or
    with ``super_scales`` the two-level form of :func:`fold_kscales` (G = 32).
    Raises ``ValueError`` on mismatched shapes or dtypes.
    """
    if super_scales is not None:
        scales, mins = fold_kscales(scales, mins, super_scales)
    n, half_k = qweight.shape
    k = 2 * half_k
    if qweight.dtype != torch.uint8 or scales.dim() != 2 or scales.shape[0] != n \
            or mins is None or scales.shape != mins.shape:
        raise ValueError(f"int4_matmul: qweight {tuple(qweight.shape)} {qweight.dtype}, "
                         f"scales {tuple(scales.shape)}, mins "
                         f"{None if mins is None else tuple(mins.shape)}, group_size "
                         f"{group_size}")
    g = _group_size(k, scales.shape[1], group_size, "int4_matmul")
    q = unpack_int4(qweight).float().view(n, k // g, g)
    return (q * scales.float()[..., None] + mins.float()[..., None]).view(n, k)


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
    super_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weight-only int4 GEMM (W4A16, asymmetric, group-wise along K).

    ``w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G]`` with ``q`` in 0..15 unpacked
    from ``qweight`` (two values per byte: low nibble = even ``k``, high nibble = odd ``k``);
    returns ``x @ w.T`` computed in fp32 and cast to ``x``'s dtype. ``mins`` is the float
    weight at ``q = 0`` (``-zero_point * scale``); GGUF Q4_0 (``mins = -8 d``), Q4_1 and Q4_K
    (``d * sc``, ``-dmin * m``) map onto it exactly with ``G = 32``.

    Args:
        x: ``[M, K]`` fp32/fp16/bf16 activations.
        qweight: ``[N, K // 2]`` uint8.
        scales, mins: ``[N, K // group_size]`` fp32 (fp16 too), or uint8 with
            ``super_scales``.
        group_size: ``G``, columns of K per (scale, min) pair; must divide K.
        super_scales: ``None``, or fp16 ``[N, K // 256, 2]``: two-level scales
            (:func:`fold_kscales`), G = 32.

    Returns:
        ``[M, N]`` in ``x.dtype``.

    Raises:
        ValueError: on mismatched shapes or dtypes.
    """
    if x.shape[-1] != 2 * qweight.shape[-1]:
        raise ValueError(f"int4_matmul: x {tuple(x.shape)}, qweight {tuple(qweight.shape)}")
    w = dequantize_int4(qweight, scales, mins, group_size, super_scales)
    return (x.float() @ w.t()).to(x.dtype)


# The integer-dot (W4A8 / W8A8) references live in reference_a8.py; re-exported here so that
# ``reference.int4_matmul_a8`` and friends keep working.
from .reference_a8 import (  # noqa: F401 (re-exports)
    A8_BLOCK,
    _a8_terms,
    int4_matmul_a8,
    int8_matmul_a8,
    quantize_activations_int8,
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

# The int5 (GGUF Q5_0) references live in reference_int5.py; re-exported here.
from .reference_int5 import (  # noqa: F401 (re-exports)
    _int5_a8_terms,
    dequantize_int5,
    int5_matmul,
    int5_matmul_a8,
    unpack_int5,
)
