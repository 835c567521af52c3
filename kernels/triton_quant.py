"""Triton weight-only quantized GEMMs: ``int8_matmul`` (W8A16) and ``int4_matmul`` (W4A16).

Weights are dequantized in registers inside the K loop and multiplied with fp32 accumulation;
only the packed bytes cross memory, which is what makes batch-1 decode (a GEMV, bound by weight
bytes) 2x / 4x faster than bf16. Layouts (agreed with ``engine/quant``; see
``kernels.reference.int8_matmul`` / ``int4_matmul``):

- int8: ``qweight [N, K]`` int8, ``scales [N]``; ``w = q * s``. The per-channel scale is
  applied once to the accumulator after the K loop (int8 values are exact in bf16).
- int4: ``qweight [N, K // 2]`` uint8, low nibble = even ``k``, high nibble = odd ``k``;
  ``scales, zeros [N, K // G]``; ``w = (q - z) * s``. A K tile never straddles a group, so each
  tile reads one (scale, zero) per column; the even and odd halves of the x tile are two dots
  against the low and high nibbles (no interleave needed).

Small-M calls (decode) split K across programs (split-K, fp32 atomics) so that a 4096-wide GEMV
still fills the GPU. Reference design: gpt-fast's int4 path and the GPTQ/AWQ kernels'
dequantize-in-the-K-loop structure (Frantar et al. 2022, arXiv 2210.17323).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import check, check_dtype, check_same_device, fp32_dot


@triton.jit
def _int8_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_chunk,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask, nmask = rm < M, rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_chunk
    k_end = tl.minimum(K, k_start + k_chunk)
    for k0 in range(k_start, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < k_end
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk,
                    mask=mmask[:, None] & kmask[None, :], other=0.0)
        q = tl.load(w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None] * stride_wk,
                    mask=nmask[None, :] & kmask[:, None], other=0)
        # int8 -> fp32 -> x dtype (exact): the 3.9 interpreter casts int8 -> bf16 as raw bits
        w = q.to(tl.float32).to(x.dtype)
        if FP32_DOT:  # see _triton_common
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    acc = acc * tl.load(s_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.atomic_add(optr, acc, mask=omask)


@triton.jit
def _int4_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, k_chunk,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    HALF: tl.constexpr = BLOCK_K // 2
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rj = tl.arange(0, HALF)
    mmask, nmask = rm < M, rn < N
    xmask = mmask[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_chunk
    k_end = tl.minimum(K, k_start + k_chunk)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    w_cols = w_ptr + rn[None, :].to(tl.int64) * stride_wn
    for k0 in range(k_start, k_end, BLOCK_K):
        k_even = k0 + 2 * rj  # [HALF]
        x_even = tl.load(x_rows + k_even[None, :] * stride_xk, mask=xmask, other=0.0)
        x_odd = tl.load(x_rows + (k_even + 1)[None, :] * stride_xk, mask=xmask, other=0.0)
        b = tl.load(w_cols + (k0 // 2 + rj)[:, None] * stride_wk, mask=nmask[None, :], other=0)
        b = b.to(tl.int32)
        g = k0 // GROUP_SIZE
        s = tl.load(s_ptr + rn * stride_sn + g * stride_sg, mask=nmask, other=0.0)
        z = tl.load(z_ptr + rn * stride_sn + g * stride_sg, mask=nmask, other=0.0)
        s = s.to(tl.float32)[None, :]
        z = z.to(tl.float32)[None, :]
        w_low = ((b & 0xF).to(tl.float32) - z) * s  # [HALF, BLOCK_N] fp32
        w_high = ((b >> 4).to(tl.float32) - z) * s
        if FP32_DOT:  # see _triton_common; the weights stay fp32 (as in the reference)
            acc = tl.dot(x_even.to(tl.float32), w_low, acc, input_precision="ieee")
            acc = tl.dot(x_odd.to(tl.float32), w_high, acc, input_precision="ieee")
        else:  # bf16/fp16 tensor-core dots on weights rounded to the activation dtype
            acc = tl.dot(x_even, w_low.to(x_even.dtype), acc)
            acc = tl.dot(x_odd, w_high.to(x_odd.dtype), acc)
    optr = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.atomic_add(optr, acc, mask=omask)


def _blocks(m: int, n: int, k: int, block_k: int, device: torch.device) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, SPLIT_K)``: small M (decode) uses 16-row tiles and splits K until
    there are about two programs per SM; large M uses 64 x 64 tiles and no split."""
    if m > 16:
        return 64, 64, 1
    block_n = 64
    programs = triton.cdiv(n, block_n)
    sms = torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else 8
    split = max(1, min(triton.cdiv(2 * sms, programs), k // (4 * block_k)))
    return 16, block_n, split


def _launch(kernel, x2, out_dtype, n, k, block_k, extra_args, extra_kw):
    m = x2.shape[0]
    block_m, block_n, split = _blocks(m, n, k, block_k, x2.device)
    k_chunk = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_chunk)
    out = torch.zeros if split > 1 else torch.empty
    buf = out((m, n), dtype=torch.float32 if split > 1 else out_dtype, device=x2.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    kernel[grid](x2, *extra_args[:-1], buf, m, n, k, k_chunk, x2.stride(0), x2.stride(1),
                 *extra_args[-1], buf.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_K=block_k, SPLIT_K=split, FP32_DOT=fp32_dot(x2.dtype), **extra_kw)
    return buf if split == 1 else buf.to(out_dtype)


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x @ (qweight * scales[:, None]).T`` (reference semantics).

    Args:
        x: ``[..., K]`` fp32/fp16/bf16.
        qweight: ``[N, K]`` int8 (any strides).
        scales: ``[N]`` fp32 or the activation dtype.

    Returns:
        ``[..., N]`` in ``x.dtype``.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices.
    """
    check_dtype("x", x)
    check(qweight.dtype == torch.int8 and qweight.dim() == 2, "qweight must be int8 [N, K]")
    n, k = qweight.shape
    check(x.shape[-1] == k and scales.shape == (n,),
          f"x {tuple(x.shape)}, qweight {tuple(qweight.shape)}, scales {tuple(scales.shape)}")
    check_dtype("scales", scales)
    check_same_device(x=x, qweight=qweight, scales=scales)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    out = _launch(_int8_kernel, x2, x.dtype, n, k, 64,
                  (qweight, scales, (qweight.stride(0), qweight.stride(1))), {})
    return out.view(*x.shape[:-1], n)


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
) -> torch.Tensor:
    """``x @ w.T`` with ``w = (unpack(qweight) - zeros) * scales`` group-wise (reference
    semantics).

    Args:
        x: ``[..., K]`` fp32/fp16/bf16.
        qweight: ``[N, K // 2]`` uint8 (low nibble = even k, high nibble = odd k).
        scales, zeros: ``[N, K // group_size]`` fp32 or the activation dtype, equal strides.
        group_size: a multiple of 32 that divides K.

    Returns:
        ``[..., N]`` in ``x.dtype``.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices, strides or an unsupported
            ``group_size``.
    """
    check_dtype("x", x)
    check(qweight.dtype == torch.uint8 and qweight.dim() == 2, "qweight must be uint8 [N, K/2]")
    n, half_k = qweight.shape
    k = x.shape[-1]
    check(k == 2 * half_k, f"x {tuple(x.shape)} does not match qweight {tuple(qweight.shape)}")
    check(group_size > 0 and group_size % 32 == 0 and k % group_size == 0,
          f"group_size {group_size} must be a multiple of 32 dividing K={k}")
    check(scales.shape == zeros.shape == (n, k // group_size)
          and scales.stride() == zeros.stride(), f"scales {tuple(scales.shape)} / zeros "
          f"{tuple(zeros.shape)} must be [{n}, {k // group_size}] with equal strides")
    check_dtype("scales", scales)
    check_dtype("zeros", zeros)
    check_same_device(x=x, qweight=qweight, scales=scales, zeros=zeros)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    block_k = next(b for b in (128, 64, 32) if group_size % b == 0)
    out = _launch(_int4_kernel, x2, x.dtype, n, k, block_k,
                  (qweight, scales, zeros, (qweight.stride(0), qweight.stride(1),
                                            scales.stride(0), scales.stride(1))),
                  {"GROUP_SIZE": group_size})
    return out.view(*x.shape[:-1], n)
