"""Triton weight-only quantized GEMMs: ``int8_matmul`` (W8A16) and ``int4_matmul`` (W4A16).

Weights are dequantized in registers inside the K loop and multiplied with fp32 accumulation;
only the packed bytes (and one fp32 scale/min per group) cross memory, which is what makes
batch-1 decode (a GEMV, bound by weight bytes) 2x / 4x faster than bf16. Layouts (the shared
contract; ``kernels.reference.int8_matmul`` / ``int4_matmul``):

- int8, group-wise: ``qweight [N, K]`` int8, ``scales [N, K // G]`` fp32 and optional
  ``mins [N, K // G]``; ``w = q * s (+ m)``. ``G = K`` (one group, no mins) is per-channel:
  the scale is applied once to the accumulator after the K loop (int8 values are exact in
  bf16). Otherwise each K tile (``BLOCK_K`` divides ``G``) reads one (scale, min) per column.
- int4, group-wise asymmetric: ``qweight [N, K // 2]`` uint8, low nibble = even ``k``, high
  nibble = odd ``k``; ``scales, mins [N, K // G]``; ``w = q * s + m`` (one fma per weight:
  ``mins`` replaces the old quantized-domain zero point, ``m = -z * s``). The even and odd
  halves of the x tile are two dots against the low and high nibbles (no interleave).

Small-M calls (decode, verification: M <= 16) may split K across programs so that a
4096-wide GEMV fills the GPU; the partial sums go to an fp32 ``[SPLIT_K, M, N]`` buffer
reduced in a fixed order (deterministic, unlike atomics), so every row of an M-row call equals
the 1-row call on that row bit for bit (batch invariance: the tiles and the split depend on N
and K only). ``split_k=1`` forces the single-pass variant (``scripts/bench_kernels.py``
measures both on a GPU). Reference design: gpt-fast's int4 path and the GPTQ/AWQ kernels'
dequantize-in-the-K-loop structure (Frantar et al. 2022, arXiv 2210.17323).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import check, check_dtype, check_same_device, fp32_dot

SMALL_M = 16  # rows of one decode/verification tile


@triton.jit
def _int8_kernel(
    x_ptr, w_ptr, s_ptr, m_ptr, out_ptr, M, N, K, k_chunk,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_os, stride_om,
    GROUP_SIZE: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr,
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
        # int8 -> fp32 first: the 3.9 interpreter casts int8 -> bf16 as raw bits
        w = q.to(tl.float32)
        if not PER_CHANNEL:
            g = k0 // GROUP_SIZE
            s = tl.load(s_ptr + rn * stride_sn + g * stride_sg, mask=nmask, other=0.0)
            w = w * s.to(tl.float32)[None, :]
            if HAS_MINS:
                mn = tl.load(m_ptr + rn * stride_sn + g * stride_sg, mask=nmask, other=0.0)
                w = w + mn.to(tl.float32)[None, :]
            w = tl.where(kmask[:, None], w, 0.0)
        if FP32_DOT:  # see _triton_common
            acc = tl.dot(x.to(tl.float32), w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    if PER_CHANNEL:
        acc = acc * tl.load(s_ptr + rn * stride_sn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    optr = out_ptr + pid_k * stride_os + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _int4_kernel(
    x_ptr, w_ptr, s_ptr, m_ptr, out_ptr, M, N, K, k_chunk,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_os, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
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
        mn = tl.load(m_ptr + rn * stride_sn + g * stride_sg, mask=nmask, other=0.0)
        s = s.to(tl.float32)[None, :]
        mn = mn.to(tl.float32)[None, :]
        w_low = (b & 0xF).to(tl.float32) * s + mn  # [HALF, BLOCK_N] fp32
        w_high = (b >> 4).to(tl.float32) * s + mn
        if FP32_DOT:  # see _triton_common; the weights stay fp32 (as in the reference)
            acc = tl.dot(x_even.to(tl.float32), w_low, acc, input_precision="ieee")
            acc = tl.dot(x_odd.to(tl.float32), w_high, acc, input_precision="ieee")
        else:  # bf16/fp16 tensor-core dots on weights rounded to the activation dtype
            acc = tl.dot(x_even, w_low.to(x_even.dtype), acc)
            acc = tl.dot(x_odd, w_high.to(x_odd.dtype), acc)
    optr = out_ptr + pid_k * stride_os + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_blocks(m: int, n: int, k: int, block_k: int, device: torch.device,
                split_k: int | None = None) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, SPLIT_K, k_chunk)``. Small M (<= 16 rows: decode, verification)
    uses 16-row tiles and, unless ``split_k`` says otherwise, splits K until there are about
    two programs per SM; the choice depends on N and K only (batch invariance). Large M uses
    64 x 64 tiles and no split."""
    if m > SMALL_M:
        block_m, block_n, split = 64, 64, 1
    else:
        block_m, block_n = SMALL_M, 64
        if split_k is None:
            programs = triton.cdiv(n, block_n)
            split_k = max(1, min(triton.cdiv(2 * _sm_count(device), programs),
                                 k // (4 * block_k)))
        split = split_k
    check(split >= 1, f"split_k must be >= 1, got {split}")
    k_chunk = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return block_m, block_n, triton.cdiv(k, k_chunk), k_chunk


def _launch(kernel, x2, n, k, block_k, tensors, strides, split_k, constexprs):
    m = x2.shape[0]
    block_m, block_n, split, k_chunk = plan_blocks(m, n, k, block_k, x2.device, split_k)
    if split == 1:
        buf = torch.empty((1, m, n), dtype=x2.dtype, device=x2.device)
    else:
        buf = torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    kernel[grid](x2, *tensors, buf, m, n, k, k_chunk, x2.stride(0), x2.stride(1), *strides,
                 buf.stride(0), buf.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_K=block_k, FP32_DOT=fp32_dot(x2.dtype), **constexprs)
    if split == 1:
        return buf[0]
    return buf.sum(dim=0).to(x2.dtype)  # fixed-order reduction: deterministic


def _groups(name: str, k: int, groups: int, group_size: int | None) -> int:
    g = k // groups if group_size is None and groups > 0 else group_size
    check(g is not None and g > 0 and k % g == 0 and k // g == groups,
          f"{name}: K={k} is not {groups} groups of {group_size}")
    return g


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor | None = None, group_size: int | None = None,
                split_k: int | None = None) -> torch.Tensor:
    """``x @ w.T`` with ``w[n, k] = qweight[n, k] * scales[n, k // G] (+ mins[n, k // G])``
    (reference semantics).

    Args:
        x: ``[..., K]`` fp32/fp16/bf16.
        qweight: ``[N, K]`` int8 (any strides).
        scales: ``[N, K // G]`` fp32 or the activation dtype; ``[N]`` or ``[N, 1]`` is per
            channel.
        mins: ``[N, K // G]`` (strides of ``scales``) or ``None``.
        group_size: ``G`` (a multiple of 16 dividing K unless ``G = K``); ``None`` =
            ``K // scales.shape[1]``.
        split_k: K partitions for small M (``None``: chosen from N, K and the SM count).

    Returns:
        ``[..., N]`` in ``x.dtype``.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or an unsupported group size.
    """
    check_dtype("x", x)
    check(qweight.dtype == torch.int8 and qweight.dim() == 2, "qweight must be int8 [N, K]")
    n, k = qweight.shape
    s2 = scales[:, None] if scales.dim() == 1 else scales
    m2 = None if mins is None else (mins[:, None] if mins.dim() == 1 else mins)
    check(x.shape[-1] == k and s2.dim() == 2 and s2.shape[0] == n,
          f"x {tuple(x.shape)}, qweight {tuple(qweight.shape)}, scales {tuple(scales.shape)}")
    g = _groups("int8_matmul", k, s2.shape[1], group_size)
    per_channel = g == k and m2 is None
    check(per_channel or g % 16 == 0, f"int8_matmul: group_size {g} must be a multiple of 16")
    check(m2 is None or (m2.shape == s2.shape and m2.stride() == s2.stride()),
          f"mins {None if m2 is None else tuple(m2.shape)} must match scales {tuple(s2.shape)}")
    check_dtype("scales", s2)
    check_same_device(x=x, qweight=qweight, scales=s2)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    block_k = 64 if per_channel else next(b for b in (64, 32, 16) if g % b == 0)
    out = _launch(_int8_kernel, x2, n, k, block_k,
                  (qweight, s2, s2 if m2 is None else m2),
                  (qweight.stride(0), qweight.stride(1), s2.stride(0), s2.stride(1)), split_k,
                  {"GROUP_SIZE": g, "PER_CHANNEL": per_channel, "HAS_MINS": m2 is not None})
    return out.view(*x.shape[:-1], n)


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    group_size: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """``x @ w.T`` with ``w[n, k] = unpack(qweight)[n, k] * scales[n, k // G] +
    mins[n, k // G]`` (reference semantics).

    Args:
        x: ``[..., K]`` fp32/fp16/bf16.
        qweight: ``[N, K // 2]`` uint8 (low nibble = even k, high nibble = odd k).
        scales, mins: ``[N, K // group_size]`` fp32 or the activation dtype, equal strides.
        group_size: a multiple of 32 that divides K.
        split_k: K partitions for small M (``None``: chosen from N, K and the SM count).

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
    check(group_size is not None and group_size > 0 and group_size % 32 == 0
          and k % group_size == 0,
          f"group_size {group_size} must be a multiple of 32 dividing K={k}")
    check(mins is not None and scales.shape == mins.shape == (n, k // group_size)
          and scales.stride() == mins.stride(), f"scales {tuple(scales.shape)} / mins "
          f"{None if mins is None else tuple(mins.shape)} must be [{n}, {k // group_size}] "
          "with equal strides")
    check_dtype("scales", scales)
    check_dtype("mins", mins)
    check_same_device(x=x, qweight=qweight, scales=scales, mins=mins)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    block_k = next(b for b in (128, 64, 32) if group_size % b == 0)
    out = _launch(_int4_kernel, x2, n, k, block_k, (qweight, scales, mins),
                  (qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1)),
                  split_k, {"GROUP_SIZE": group_size})
    return out.view(*x.shape[:-1], n)
