"""PyTorch references of the int6 (GGUF Q6_K held exactly) CPU kernels, ``kernels/cpu/qa6*.cpp``.

Layout (``localchat.engine.quant.int6_layout`` and ``qa6.h``): ``qlow`` uint8 ``[N, K // 2]``
(low 4 bits of ``u = q + 32``, low nibble = even k), ``qhigh`` uint8 ``[N, K // 4]`` (top 2
bits, 32 bytes per 128-column chunk), ``scales`` int8 ``[N, K // 16]``, ``super_scales`` fp16
``[N, K // 256]``; ``w = (u - 32) * (float(d) * float(sc))`` in fp32. Everything here is also
importable from ``localchat.kernels.reference``.
"""

from __future__ import annotations

import torch

from .reference_a8 import quantize_activations_int8


def _check_int6(qlow, qhigh, scales, super_scales) -> tuple[int, int]:
    n, half_k = qlow.shape
    k = 2 * half_k
    if (k % 256 or qlow.dtype != torch.uint8 or qhigh.dtype != torch.uint8
            or tuple(qhigh.shape) != (n, k // 4) or scales.dtype != torch.int8
            or tuple(scales.shape) != (n, k // 16) or super_scales.dtype != torch.float16
            or tuple(super_scales.shape) != (n, k // 256)):
        raise ValueError(
            f"int6: qlow {tuple(qlow.shape)} {qlow.dtype}, qhigh {tuple(qhigh.shape)} "
            f"{qhigh.dtype}, scales {tuple(scales.shape)} {scales.dtype}, super_scales "
            f"{tuple(super_scales.shape)} {super_scales.dtype}: need K % 256 == 0, uint8 "
            "[N, K/2], uint8 [N, K/4], int8 [N, K/16], fp16 [N, K/256]")
    return n, k


def unpack_int6(qlow: torch.Tensor, qhigh: torch.Tensor) -> torch.Tensor:
    """``qlow [N, K // 2]``, ``qhigh [N, K // 4]`` uint8 -> ``u [N, K]`` uint8 (0..63)."""
    n, half_k = qlow.shape
    k = 2 * half_k
    low = torch.stack((qlow & 0x0F, qlow >> 4), -1).view(n, k // 128, 64, 2)
    h = qhigh.view(n, k // 128, 1, 32)
    # byte j of a chunk: bits 0-1 / 4-5 -> qlow byte j (even / odd), bits 2-3 / 6-7 -> j + 32
    top = torch.cat((h, h >> 2), -2).view(n, k // 128, 64)
    high = torch.stack((top & 3, (top >> 4) & 3), -1)
    return (low | (high << 4)).view(n, k)


def int6_scales(scales: torch.Tensor, super_scales: torch.Tensor) -> torch.Tensor:
    """Per 16-column sub-block fp32 scale ``d * sc`` ``[N, K // 16]`` (exact)."""
    return super_scales.float().repeat_interleave(16, 1) * scales.float()


def dequantize_int6(qlow, qhigh, scales, super_scales) -> torch.Tensor:
    """int6 weights -> fp32 ``[N, K]``: ``(u - 32) * (d * sc)``, one fp32 rounding (equal bit
    for bit to ``gguf.quants.dequantize`` of the Q6_K blocks they were repacked from).
    Raises ``ValueError`` on bad shapes or dtypes."""
    n, k = _check_int6(qlow, qhigh, scales, super_scales)
    q = unpack_int6(qlow, qhigh).float() - 32.0
    return (q.view(n, k // 16, 16) * int6_scales(scales, super_scales)[..., None]).view(n, k)


def int6_matmul(x, qlow, qhigh, scales, super_scales) -> torch.Tensor:
    """``x [M, K]`` (fp32/bf16/fp16) @ the dequantized int6 weights.T -> ``[M, N]`` in
    ``x.dtype``, fp32 arithmetic (``kernels/cpu`` sums in another fixed order)."""
    w = dequantize_int6(qlow, qhigh, scales, super_scales)
    return (x.float() @ w.t()).to(x.dtype)


def _int6_a8_terms(x, qlow, qhigh, scales, super_scales) -> torch.Tensor:
    """The fp32 terms ``[M, N, K // 16]`` the integer-dot kernels sum: per 16-column
    sub-block ``j``, ``float(sum_k (u - 32) * xq) * ((d * sc[j]) * dact[m, j // 2])`` (exact
    integer dot, two fp32 products), ``xq, dact`` from :func:`quantize_activations_int8`."""
    n, k = _check_int6(qlow, qhigh, scales, super_scales)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"int6_matmul_a8: x {tuple(x.shape)} does not match K={k}")
    xq, d = quantize_activations_int8(x)
    m = x.shape[0]
    q = unpack_int6(qlow, qhigh).double() - 32.0
    dots = torch.einsum("mjs,njs->mnj", xq.double().view(m, k // 16, 16),
                        q.view(n, k // 16, 16)).float()
    sd = int6_scales(scales, super_scales)[None] * d.repeat_interleave(2, 1)[:, None]
    return dots * sd


def int6_matmul_a8(x, qlow, qhigh, scales, super_scales) -> torch.Tensor:
    """W6A8 integer-dot GEMM, the math of ``kernels/cpu/qa6*.cpp``: ``x [M, K]`` quantized per
    row and 32-column block to int8 (:func:`quantize_activations_int8`), exact integer dots
    with ``q = u - 32`` per 16-column sub-block, each times ``(d * sc) * dact`` and summed in
    fp32 (:func:`_int6_a8_terms`). Returns ``[M, N]`` in ``x.dtype``. Raises ``ValueError`` on
    bad shapes."""
    return _int6_a8_terms(x, qlow, qhigh, scales, super_scales).sum(-1).to(x.dtype)
