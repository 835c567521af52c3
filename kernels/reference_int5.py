"""PyTorch references of the int5 (GGUF Q5_0 held exactly) CPU kernels, ``kernels/cpu/qa5*.cpp``.

Layout (``localchat.engine.quant.int5_layout`` and ``qa5.h``): ``qlow`` uint8 ``[N, K // 2]``
(low 4 bits of ``u = q + 16``, low nibble = even k), ``qhigh`` uint8 ``[N, K // 8]`` (the top
bit, 16 bytes per 128-column chunk: a 64-bit mask for the even columns, one for the odd),
``scales`` fp16 ``[N, K // 32]``; ``w = (u - 16) * float(d)`` in fp32 (exact). Everything here
is also importable from ``localchat.kernels.reference``.
"""

from __future__ import annotations

import torch

from .reference_a8 import quantize_activations_int8


def _check_int5(qlow, qhigh, scales) -> tuple[int, int]:
    n, half_k = qlow.shape
    k = 2 * half_k
    if (k % 128 or qlow.dtype != torch.uint8 or qhigh.dtype != torch.uint8
            or tuple(qhigh.shape) != (n, k // 8) or scales.dtype != torch.float16
            or tuple(scales.shape) != (n, k // 32)):
        raise ValueError(
            f"int5: qlow {tuple(qlow.shape)} {qlow.dtype}, qhigh {tuple(qhigh.shape)} "
            f"{qhigh.dtype}, scales {tuple(scales.shape)} {scales.dtype}: need K % 128 == 0, "
            "uint8 [N, K/2], uint8 [N, K/8], fp16 [N, K/32]")
    return n, k


def unpack_int5(qlow: torch.Tensor, qhigh: torch.Tensor) -> torch.Tensor:
    """``qlow [N, K // 2]``, ``qhigh [N, K // 8]`` uint8 -> ``u [N, K]`` uint8 (0..31)."""
    n, half_k = qlow.shape
    k = 2 * half_k
    nc = k // 128
    low = torch.stack((qlow & 0x0F, qlow >> 4), -1).view(n, nc, 64, 2)
    # bit i of the chunk's 8-byte mask h (h = 0 even, 1 odd): byte i // 8, bit i % 8
    bits = qhigh.view(n, nc, 2, 8, 1) >> torch.arange(8, dtype=torch.uint8)
    top = (bits & 1).view(n, nc, 2, 64).transpose(-1, -2)  # [n, nc, 64, 2]
    return (low | (top << 4)).reshape(n, k)


def dequantize_int5(qlow, qhigh, scales) -> torch.Tensor:
    """int5 weights -> fp32 ``[N, K]``: ``(u - 16) * d`` (exact; equal bit for bit to
    ``gguf.quants.dequantize`` of the Q5_0 blocks they were repacked from).
    Raises ``ValueError`` on bad shapes or dtypes."""
    n, k = _check_int5(qlow, qhigh, scales)
    q = unpack_int5(qlow, qhigh).float() - 16.0
    return (q.view(n, k // 32, 32) * scales.float()[..., None]).view(n, k)


def int5_matmul(x, qlow, qhigh, scales) -> torch.Tensor:
    """``x [M, K]`` (fp32/bf16/fp16) @ the dequantized int5 weights.T -> ``[M, N]`` in
    ``x.dtype``, fp32 arithmetic (``kernels/cpu`` sums in another fixed order)."""
    w = dequantize_int5(qlow, qhigh, scales)
    return (x.float() @ w.t()).to(x.dtype)


def _int5_a8_terms(x, qlow, qhigh, scales) -> torch.Tensor:
    """The fp32 terms ``[M, N, K // 32]`` the integer-dot kernels sum: per 32-column block
    ``j``, ``float(sum_k (u - 16) * xq) * (d[n, j] * dact[m, j])`` (exact integer dot, two
    fp32 products), ``xq, dact`` from :func:`quantize_activations_int8`."""
    n, k = _check_int5(qlow, qhigh, scales)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"int5_matmul_a8: x {tuple(x.shape)} does not match K={k}")
    xq, d = quantize_activations_int8(x)
    m = x.shape[0]
    q = unpack_int5(qlow, qhigh).double() - 16.0
    dots = torch.einsum("mjs,njs->mnj", xq.double().view(m, k // 32, 32),
                        q.view(n, k // 32, 32)).float()
    return dots * (scales.float()[None] * d[:, None])


def int5_matmul_a8(x, qlow, qhigh, scales) -> torch.Tensor:
    """W5A8 integer-dot GEMM, the math of ``kernels/cpu/qa5*.cpp``: ``x [M, K]`` quantized per
    row and 32-column block to int8 (:func:`quantize_activations_int8`), exact integer dots
    with ``q = u - 16`` per 32-column block, each times ``d * dact`` and summed in fp32
    (:func:`_int5_a8_terms`). Returns ``[M, N]`` in ``x.dtype``. Raises ``ValueError`` on bad
    shapes."""
    return _int5_a8_terms(x, qlow, qhigh, scales).sum(-1).to(x.dtype)
