"""Shared pieces of the Triton launchers: interpreter detection, dot precision, checks.

Kernels take an ``FP32_DOT`` constexpr (``fp32_dot(dtype)``) to work around a Triton 3.9
interpreter bug: under ``TRITON_INTERPRET=1`` the interpreter's ``create_dot`` multiplies
bfloat16 operands as their raw uint16 bit patterns. With ``FP32_DOT`` set (fp32 inputs, or the
interpreter), dot operands are upcast to fp32 and multiplied with ``input_precision="ieee"``:
exact products with fp32 accumulation, which is what a tensor-core bf16 MMA computes. On a GPU
with bf16 inputs the native bf16 dot runs. (The dot is written inline in each kernel: calling a
``@triton.jit`` helper costs milliseconds per call in the interpreter.)
"""

from __future__ import annotations

import os

import torch
import triton

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older ones read the variable
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def fp32_dot(dtype: torch.dtype) -> bool:
    """Whether kernels should upcast dot operands to fp32 (see the module docstring)."""
    return dtype == torch.float32 or interpreting()


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (Triton block sizes must be powers of two)."""
    return triton.next_power_of_2(max(1, int(n)))


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` when ``cond`` is false (launcher argument checks)."""
    if not cond:
        raise ValueError(msg)


def check_dtype(name: str, t: torch.Tensor, allowed=SUPPORTED_DTYPES) -> None:
    """Raise ``ValueError`` unless ``t.dtype`` is one of ``allowed``."""
    check(t.dtype in allowed, f"{name}: dtype {t.dtype} not in {allowed}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless all tensors live on one device."""
    devices = {t.device for t in tensors.values()}
    check(len(devices) == 1, f"tensors on different devices: "
          f"{ {k: str(v.device) for k, v in tensors.items()} }")


def check_inner_contiguous(name: str, t: torch.Tensor, ndims: int) -> None:
    """Raise ``ValueError`` unless the last ``ndims`` dims of ``t`` are packed row-major
    (the leading dims may have any stride)."""
    expected = 1
    for d in range(t.dim() - 1, t.dim() - 1 - ndims, -1):
        check(t.shape[d] == 1 or t.stride(d) == expected,
              f"{name}: last {ndims} dims must be contiguous, got strides {t.stride()}")
        expected *= t.shape[d]
