"""PyTorch references of the integer-dot (W4A8 / W8A8) CPU matmuls, ``kernels/cpu/qa8*.cpp``.

Activations are quantized per row and 32-column block to int8 (llama.cpp's Q8_0 activation
blocks: ``d = amax / 127``), dotted exactly in integers with the weights' int4 / int8 q, and
the block terms summed in fp32. Weight layouts as in ``reference.py`` (``int4_matmul``,
``int8_matmul``); everything here is also importable from ``localchat.kernels.reference``.
"""

from __future__ import annotations

import torch

from .reference_quant import _group_size, fold_kscales, unpack_int4

A8_BLOCK = 32  # activation columns per int8 block (Q8_0-style)


def quantize_activations_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, per 32-column block symmetric int8 quantization (llama.cpp's Q8_0 blocks).

    ``d = amax / 127`` (fp32), ``q = round_half_even(x * (1 / d))`` clamped to -127..127
    (``q = 0`` where ``d = 0``). ``x [M, K]`` (K a multiple of 32) -> ``(q [M, K]`` int8,
    ``d [M, K // 32]`` fp32), ``x ~= q * d``. Raises ``ValueError`` if K % 32 != 0.
    """
    m, k = x.shape
    if k % A8_BLOCK:
        raise ValueError(f"quantize_activations_int8: K={k} is not a multiple of {A8_BLOCK}")
    xb = x.float().reshape(m, k // A8_BLOCK, A8_BLOCK)
    d = xb.abs().amax(-1) / 127.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, 1.0), torch.zeros_like(d))
    q = torch.round(xb * inv[..., None]).clamp(-127, 127)
    return q.to(torch.int8).reshape(m, k), d


def _a8_terms(x, q, scales, mins, group_size):
    """The fp32 terms the integer-dot kernels sum: ``(dots [M, N, J], mins [M, N, ng] or
    None)`` with ``J`` sub-blocks of ``S = min(G, 32)`` columns:
    ``dots[m, n, j] = float(sum_{k in j} q[n, k] * xq[m, k]) * (scales[n, g(j)] * d[m, b(j)])``
    (exact integer dot, one fp32 product) and ``mins[m, n, g] = mins[n, g] * xs[m, g]`` with
    ``xs[m, g] = sum_{j in g} d[m, b(j)] * sum_{k in j} xq[m, k]`` (fp32)."""
    n, k = q.shape
    g = group_size
    sub = 16 if g == 16 else A8_BLOCK
    if g != 16 and g % A8_BLOCK or k % g or k % A8_BLOCK:
        raise ValueError(f"a8 matmul: K={k}, group_size={g}: need K % 32 == 0 and G = 16 or "
                         "a multiple of 32")
    xq, d = quantize_activations_int8(x)
    mrows = x.shape[0]
    nsub = k // sub
    xs_sub = xq.double().reshape(mrows, nsub, sub)
    dots = torch.einsum("mjs,njs->mnj", xs_sub, q.double().reshape(n, nsub, sub)).float()
    sub_group = torch.arange(nsub) * sub // g
    sub_block = torch.arange(nsub) * sub // A8_BLOCK
    sd = scales.float()[:, sub_group][None] * d[:, sub_block][:, None]  # [M, N, J]
    terms = dots * sd
    if mins is None:
        return terms, None
    part = d[:, sub_block] * xs_sub.sum(-1).float()  # [M, J]
    xs = torch.zeros(mrows, k // g).index_add_(1, sub_group, part)
    return terms, mins.float()[None] * xs[:, None]


def int4_matmul_a8(x, qweight, scales, mins, group_size, super_scales=None):
    """W4A8 integer-dot GEMM: ``x`` quantized by :func:`quantize_activations_int8`, exact
    integer dots with int4 q (0..15) per 32-column block, then
    ``out = sum_j dots + sum_g mins * xs`` in fp32 (see :func:`_a8_terms`); the approximation
    of :func:`int4_matmul` that ``kernels/cpu/qa8*.cpp`` computes (error: activation rounding,
    at most ``d/2`` per element).

    ``x [M, K]`` fp32/bf16/fp16 (K % 32 == 0); ``qweight [N, K // 2]`` uint8; ``scales``,
    ``mins`` ``[N, K // G]`` fp32 or fp16, G a multiple of 32, or uint8 with ``super_scales``
    fp16 ``[N, K // 256, 2]`` (two-level, ``reference.fold_kscales``; G = 32). Returns
    ``[M, N]`` in ``x.dtype``. Raises ``ValueError`` on bad shapes.
    """
    if super_scales is not None:
        scales, mins = fold_kscales(scales, mins, super_scales)
    q = unpack_int4(qweight)
    terms, mterms = _a8_terms(x, q, scales, mins, group_size)
    return (terms.sum(-1) + mterms.sum(-1)).to(x.dtype)


def int8_matmul_a8(x, qweight, scales, mins=None, group_size=None):
    """W8A8 integer-dot GEMM over group-wise int8 weights (``w = q * s (+ m)``, G = 16 or a
    multiple of 32; 1-D ``scales`` = per channel), activations as in :func:`int4_matmul_a8`.
    Returns ``[M, N]`` in ``x.dtype``. Raises ``ValueError`` on bad shapes."""
    if scales.dim() == 1:
        scales = scales[:, None]
        mins = None if mins is None else mins.reshape(-1, 1)
    g = _group_size(x.shape[-1], scales.shape[1], group_size, "int8_matmul_a8")
    terms, mterms = _a8_terms(x, qweight, scales, mins, g)
    out = terms.sum(-1)
    return (out if mterms is None else out + mterms.sum(-1)).to(x.dtype)
