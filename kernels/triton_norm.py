"""Triton RMSNorm and residual-add + RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467).

One program per row holds the whole row (``hidden`` up to a few thousand elements) in
registers: a read, an fp32 reduction, a write. Rounding follows HF Llama (and
``kernels.reference``): ``normed = (x_f32 * rsqrt(mean(x_f32^2) + eps))`` is cast to ``x``'s
dtype, then multiplied by ``weight`` and rounded to ``promote(x.dtype, weight.dtype)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import check, check_dtype, check_same_device, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_res, stride_out, stride_res_out, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + offs, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / hidden
    normed = (xf * tl.rsqrt(var + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def _rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t [..., hidden]`` as a 2-D ``[rows, hidden]`` view (a copy only if no view exists)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_dtype("x", x)
    check_dtype("weight", weight)
    check(x.dim() >= 1 and weight.shape == (x.shape[-1],),
          f"weight {tuple(weight.shape)} must be [{x.shape[-1] if x.dim() else '?'}]")
    check_same_device(x=x, weight=weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (reference semantics).

    Args:
        x: ``[..., hidden]`` fp32/fp16/bf16 (any leading shape; the last dim contiguous or
            copied).
        weight: ``[hidden]``.
        eps: added to the mean square.

    Returns:
        A new tensor of ``x``'s shape in ``promote_types(x.dtype, weight.dtype)``.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices.
    """
    _check(x, weight)
    x2 = _rows("x", x)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2, weight, out, out, x2.stride(0), 0, out.stride(0), 0, x2.shape[1], eps,
            HAS_RESIDUAL=False, BLOCK=next_pow2(x2.shape[1]),
        )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + residual``; returns ``(rms_norm(residual), residual)``.

    In-place contract: the new residual is written into ``residual`` and, when the output
    dtype equals ``x.dtype``, the normed rows are written into ``x``; the returned tensors
    are those buffers. Callers must not reuse ``x`` or ``residual`` afterwards (the model's
    decoder layers never do). The sum is rounded to ``residual``'s dtype before the norm,
    as the reference's ``x + residual`` is.

    Args:
        x, residual: ``[num_tokens, hidden]`` with equal dtypes, rows contiguous.
        weight: ``[hidden]``.
        eps: added to the mean square.

    Raises:
        ValueError: on mismatched shapes, dtypes, devices or strides.
    """
    _check(x, weight)
    check(x.shape == residual.shape and x.dtype == residual.dtype,
          f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} "
          f"{residual.dtype} must match")
    check_same_device(x=x, residual=residual)
    check(x.dim() == 2 and x.stride(-1) == 1 and residual.stride(-1) == 1,
          "x and residual must be [num_tokens, hidden] with contiguous rows")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = x if out_dtype == x.dtype else torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](
            x, residual, weight, out, residual, x.stride(0), residual.stride(0), out.stride(0),
            residual.stride(0), x.shape[1], eps, HAS_RESIDUAL=True, BLOCK=next_pow2(x.shape[1]),
        )
    return out, residual
