"""W4A16 int4 weights: asymmetric, group-wise along the input dim.

Layout (shared with ``localchat.kernels.int4_matmul``): ``qweight`` uint8 ``[N, K // 2]``, two
4-bit values per byte, the low nibble holding even ``k`` and the high nibble odd ``k``;
``scales`` and ``mins`` fp32 ``[N, K // group_size]``;
``w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G]``, q in 0..15 (the GGUF form: Q4_0,
Q4_1 and Q4_K repack onto it exactly, ``engine/quant/gguf_repack.py``). Two-level ("k-")
scales, GGUF Q4_K as held in its file: ``scales`` / ``mins`` uint8 ``[N, K // 32]`` (the 6-bit
``sc``, ``m``) and ``super_scales`` fp16 ``[N, K // 256, 2]`` (``d, -dmin``), which
:func:`fold_kscales` (``localchat.kernels.reference``) turns into the fp32 form exactly.
Reference: min/max asymmetric group quantization as in GPTQ's / AWQ's storage format (Frantar
et al. 2022, arXiv 2210.17323; Lin et al. 2023, arXiv 2306.00978) with round-to-nearest.

Group size: 128 by default (32 for GGUF sources, see ``loader.default_group_size``); a layer
whose K is not a multiple of it uses the largest of 128 / 64 / 32 below it that divides K
(:func:`pick_group_size`), and a layer with none stays unquantized.
"""

from __future__ import annotations

import torch

from localchat.kernels.reference import fold_kscales  # the layout's fold (re-exported)

QMAX = 15
GROUP_SIZES = (128, 64, 32)


def pick_group_size(in_features: int, preferred: int = 128) -> int | None:
    """The group size for a layer of ``in_features`` inputs: ``preferred`` if it divides it,
    else the largest of 128/64/32 below ``preferred`` that does; ``None`` if none does (the
    layer then stays unquantized)."""
    for g in (preferred, *[g for g in GROUP_SIZES if g < preferred]):
        if in_features % g == 0:
            return g
    return None


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``q [N, K]`` integers in 0..15 (K even) -> uint8 ``[N, K // 2]``: low nibble = even k,
    high nibble = odd k. Raises ``ValueError`` for an odd K or values out of range."""
    if q.shape[-1] % 2:
        raise ValueError(f"K must be even to pack int4, got {q.shape[-1]}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > QMAX):
        raise ValueError("int4 values must lie in 0..15")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K // 2]`` -> uint8 ``[N, K]`` in 0..15 (inverse of :func:`pack_int4`)."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_int4(
    weight: torch.Tensor, group_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` -> ``(qweight uint8 [N, K // 2], scales fp32 [N, K // G],
    mins fp32 [N, K // G])``.

    Per group: ``scale = (max - min) / 15`` (1.0 for a constant group), ``min`` the group's
    minimum (so min and max map onto 0 and 15), ``q = round((w - min) / scale)`` clamped to
    0..15; the error is at most ``scale / 2`` per element (plus fp32 rounding).
    Raises ``ValueError`` unless ``weight`` is 2-D float with K a multiple of ``group_size``
    and ``group_size`` even.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D float weight, got {tuple(weight.shape)} {weight.dtype}")
    n, k = weight.shape
    if group_size <= 0 or group_size % 2 or k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of an even group size {group_size}")
    w = weight.float().reshape(n, k // group_size, group_size)
    wmin, wmax = torch.aminmax(w, dim=-1)
    span = wmax - wmin
    scales = torch.where(span > 0, span / QMAX, torch.ones_like(span))
    q = (w - wmin[..., None]).div_(scales[..., None]).round_().clamp_(0, QMAX)
    q = q.to(torch.uint8).reshape(n, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), scales, wmin


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
    dtype: torch.dtype = torch.float32, super_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """``qweight uint8 [N, K // 2]``, ``scales``/``mins [N, K // G]`` -> weights ``[N, K]``:
    ``q * scale + min`` in fp32 (the product is exact for GGUF scales, one rounding on the
    add), then cast to ``dtype``. With ``super_scales`` (fp16 ``[N, K // 256, 2]``) the
    scales / mins are the uint8 two-level form (:func:`fold_kscales`). Raises ``ValueError``
    on mismatched two-level shapes."""
    if super_scales is not None:
        scales, mins = fold_kscales(scales, mins, super_scales)
    q = unpack_int4(qweight).float()
    n, k = q.shape
    groups = scales.shape[1]
    q = q.reshape(n, groups, k // groups)
    w = q * scales.float()[..., None] + mins.float()[..., None]
    return w.reshape(n, k).to(dtype)


def to_cpu_int4pack(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repack our layout for ``torch.ops.aten._weight_int4pack_mm_for_cpu``.

    Returns ``(packed uint8 [N, K // 2] in PyTorch's CPU tile order, scales_and_zeros
    [K // G, N, 2] in ``dtype``)``. PyTorch's kernel computes ``(q - 8) * s + z'``; ours is
    ``q * s + min``, so ``z' = min + 8 s`` (exact in fp32; the bf16 cast rounds).
    """
    q = unpack_int4(qweight).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    zp = mins.float() + 8.0 * scales.float()
    scales_and_zeros = torch.stack((scales.float(), zp), dim=-1).transpose(0, 1).contiguous()
    return packed, scales_and_zeros.to(dtype)


def kscale_weight_bytes(out_features: int, in_features: int) -> int:
    """Bytes of one int4 weight with two-level scales: ``N * K / 2`` plus a uint8 scale and
    min per 32 and two fp16 per 256 (18.5 bytes per 32 weights; GGUF Q4_K's file: 18)."""
    return out_features * in_features // 2 + 2 * out_features * (in_features // 32) \
        + 4 * out_features * (in_features // 256)


def int4_weight_bytes(
    out_features: int, in_features: int, group_size: int, scale_bytes: int = 4
) -> int:
    """Bytes of one int4 weight: ``N * K / 2`` plus a scale and a min per group."""
    groups = in_features // group_size
    return out_features * in_features // 2 + 2 * out_features * groups * scale_bytes
