"""FP8 e4m3 weights, one scale per output channel, for CUDA GPUs of compute capability >= 8.9.

Layout: ``qweight`` ``torch.float8_e4m3fn [N, K]`` and ``scales`` fp32 ``[N]``;
``w[n, k] = float(qweight[n, k]) * scales[n]``. At run time the activations are scaled per token
to e4m3 as well and ``torch._scaled_mm`` multiplies with row-wise scales (the recipe of vLLM's
``Fp8LinearMethod`` with per-channel weights; Micikevicius et al. 2022, arXiv 2209.05433).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` float -> ``(qweight float8_e4m3fn [N, K], scales fp32 [N])``.

    ``scales[n] = max_k |w[n, k]| / 448`` (1.0 for an all-zero row); e4m3 keeps 3 mantissa bits,
    so the relative error per element is at most 2**-4 (plus subnormal spacing near zero).
    Raises ``ValueError`` unless ``weight`` is 2-D floating point.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D float weight, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    qweight = (w / scales[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return qweight, scales


def dequantize_fp8(
    qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``qweight e4m3 [N, K]``, ``scales [N]`` -> weights ``[N, K]`` in ``dtype``."""
    return (qweight.float() * scales.float()[:, None]).to(dtype)


def fp8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K]`` (bf16/fp16/fp32, CUDA) @ dequantized weight.T -> ``[M, N]`` in x's dtype.

    Activations are quantized per row to e4m3 (scale = row absmax / 448) and
    ``torch._scaled_mm`` applies both row-wise scales in its epilogue (fp32 accumulate) into a
    bf16 output (the only dtype row-wise scaling supports), cast to ``x.dtype``. Shapes
    ``_scaled_mm`` rejects (K or N not a multiple of 16) fall back to dequantize-then-matmul.
    """
    n, k = qweight.shape
    if k % 16 or n % 16:
        return torch.nn.functional.linear(x, dequantize_fp8(qweight, scales, x.dtype), bias)
    x_scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp_(min=1e-12)
    x_q = (x.float() / x_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    # Row-wise scaling (scale_a [M, 1], scale_b [1, N]) produces only bf16 in cuBLASLt /
    # PyTorch's _scaled_mm: ask for bf16 whatever the activations are, then cast (fp16, fp32).
    y = torch._scaled_mm(x_q, qweight.t(), scale_a=x_scale, scale_b=scales.float().view(1, n),
                         out_dtype=torch.bfloat16)
    y = y.to(x.dtype)
    return y if bias is None else y + bias


def fp8_weight_bytes(out_features: int, in_features: int) -> int:
    """Bytes of one fp8 weight: ``N * K`` e4m3 plus ``N`` fp32 scales."""
    return out_features * in_features + 4 * out_features
