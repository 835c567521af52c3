"""W8A16 int8 weights: symmetric, one scale per output channel.

Layout (shared with ``localchat.kernels.int8_matmul``): ``qweight`` int8 ``[N, K]``
(N = out_features, K = in_features) and ``scales`` fp32 ``[N]``;
``w[n, k] = qweight[n, k] * scales[n]`` with ``qweight`` in -127..127 (-128 unused, so the
range is symmetric). Reference: the LLM.int8() / "absmax" per-row quantization (Dettmers et al.
2022, arXiv 2208.07339, without the outlier decomposition); vLLM's and torchao's W8A16.
"""

from __future__ import annotations

import torch

QMAX = 127


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` (any float dtype) to ``(qweight int8 [N, K], scales fp32 [N])``.

    ``scales[n] = max_k |w[n, k]| / 127`` (1.0 for an all-zero row); rounding to nearest, so
    ``|w - dequantize_int8(...)| <= scales[n] / 2`` element-wise.
    Raises ``ValueError`` unless ``weight`` is 2-D floating point.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D float weight, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    qweight = (w / scales[:, None]).round_().clamp_(-QMAX, QMAX).to(torch.int8)
    return qweight, scales


def dequantize_int8(
    qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``qweight int8 [N, K]``, ``scales [N]`` -> weights ``[N, K]`` in ``dtype``."""
    return (qweight.float() * scales.float()[:, None]).to(dtype)


def int8_weight_bytes(out_features: int, in_features: int, scale_bytes: int = 4) -> int:
    """Bytes of one int8 weight: ``N * K`` int8 plus ``N`` scales of ``scale_bytes`` each."""
    return out_features * in_features + out_features * scale_bytes


def dequantize_int8_grouped(
    qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Group-wise int8: ``qweight int8 [N, K]``, ``scales [N, K // G]`` (fp32 or fp16) (``[N, 1]`` or
    ``[N]`` is per channel), ``mins`` like ``scales`` or ``None`` -> weights ``[N, K]``:
    ``q * scale (+ min)`` in fp32, then cast to ``dtype``. The GGUF types Q8_0, Q5_0, Q5_1,
    Q5_K, Q6_K (``engine/quant/gguf_repack.py``) use this layout with G = 32 or 16."""
    n, k = qweight.shape
    s = scales.float().reshape(n, -1)
    q = qweight.float().reshape(n, s.shape[1], -1)
    w = q * s[..., None]
    if mins is not None:
        w = w + mins.float().reshape(n, -1)[..., None]
    return w.reshape(n, k).to(dtype)


def int8_grouped_weight_bytes(out_features: int, in_features: int, group_size: int,
                              has_mins: bool, scale_bytes: int = 4) -> int:
    """Bytes of one group-wise int8 weight: ``N * K`` plus a scale (and a min) of
    ``scale_bytes`` each per group."""
    groups = out_features * (in_features // group_size)
    return out_features * in_features + groups * scale_bytes * (2 if has_mins else 1)
