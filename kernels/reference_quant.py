"""PyTorch references of the group-wise int8 and int4 weight formats (``engine/quant/``): their
dequantization and a matmul that dequantizes to fp32 first. These are the oracles of the C++
exact-activation kernels (``kernels/cpu``), the int4 / int8 Triton kernels and the PyTorch
fallback where no kernel runs. Layouts: int8 ``qweight [N, K]`` with ``scales`` (and
``mins``) ``[N, K // G]``; int4 two columns per byte (low nibble = even k), GGUF Q4_K's
two-level scales folded by :func:`fold_kscales`. Everything here is also importable from
``localchat.kernels.reference``.
"""

from __future__ import annotations

import torch


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
