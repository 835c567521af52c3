"""Dispatch of the quantized matmuls (``int8_matmul``, ``int4_matmul``): Triton on CUDA, the
C++ kernels for CPU calls of up to ``CPU_MAX_ROWS`` rows (the integer-dot W8A8 / W4A8 ones
where :func:`localchat.kernels.cpu_a8_enabled`, else the exact fp32-activation ones), the
references otherwise; and the same choice as a description of the call (``cpu_int8_call``,
``cpu_int4_call``: an op name and its arguments, ``INPUT`` in the input's place), which the
linear methods' ``decode_plan`` hands to the C++ decoder stack. Re-exported by
``localchat.kernels``."""

from __future__ import annotations

import torch

from . import _cpu, _triton, _use_cpu, _use_triton, cpu_a8_enabled, reference


def _a8_group_ok(k: int, g: int, int4: bool) -> bool:
    return k % 32 == 0 and k % g == 0 and (g % 32 == 0 or (g == 16 and not int4))


def _scales_ok(scales, mins) -> bool:
    return scales.dtype in (torch.float32, torch.float16) and scales.is_contiguous() and (
        mins is None or (mins.dtype == scales.dtype and mins.is_contiguous()))


def int8_matmul(x, qweight, scales, mins=None, group_size: int | None = None):
    """See ``reference.int8_matmul`` (group-wise int8, optional ``mins``; ``group_size``
    None = ``K // scales.shape[1]``). On CPU for up to ``CPU_MAX_ROWS`` rows: where
    :func:`cpu_a8_enabled` (16-bit ``x`` by default) the W8A8 integer-dot kernel
    (``reference.int8_matmul_a8``'s math; fp32 or fp16 scales read in place) when K is a
    multiple of 32 and G is 16 or a multiple of 32, else the exact fp32-activation kernel."""
    if _use_triton(x):
        return _triton("triton_quant").int8_matmul(x, qweight, scales, mins, group_size)
    call = cpu_int8_call(x.dtype, x.shape[-1], qweight, scales, mins, group_size) \
        if _use_cpu(x) else None
    if call is not None:
        name, args = call
        return getattr(torch.ops.localchat_cpu, name)(x, *args[1:])
    return reference.int8_matmul(x, qweight, scales, mins, group_size)


# The input's place in an op call described by ``cpu_int8_call`` and the linear methods'
# ``decode_plan`` (``kernels/cpu/stack_ops.cpp`` puts each step's activations there).
INPUT = object()


def cpu_int8_call(dtype: torch.dtype, k: int, qweight, scales, mins=None,
                  group_size: int | None = None) -> tuple[str, tuple] | None:
    """The C++ op :func:`int8_matmul` runs for CPU rows (at most ``CPU_MAX_ROWS``) of ``dtype``
    with ``k`` columns: ``(name of a torch.ops.localchat_cpu op, its arguments with INPUT for
    x)``, or None where the reference runs (a layout the kernels do not take, or no kernels)."""
    if not (qweight.dtype == torch.int8 and qweight.dim() == 2 and k == qweight.shape[1]
            and scales.dim() in (1, 2) and scales.shape[0] == qweight.shape[0]):
        return None
    g = k // (scales.shape[1] if scales.dim() == 2 else 1)
    cpu = _cpu()
    if (group_size is not None and group_size != g) or cpu is None:
        return None
    isa = cpu.active_isa()
    if cpu_a8_enabled(dtype) and _a8_group_ok(k, g, False) and _scales_ok(scales, mins) \
            and qweight.is_contiguous():
        if scales.dim() == 1:
            scales = scales[:, None]
            mins = None if mins is None else mins.reshape(-1, 1)
        return "int8_matmul_a8", (INPUT, qweight, scales, mins, g, isa)
    if not _scales_ok(scales, mins):
        scales, mins = scales.float(), None if mins is None else mins.float()
    return "int8_matmul", (INPUT, qweight, scales, mins, g, isa)


def cpu_int4_call(dtype: torch.dtype, k: int, qweight, scales, mins, group_size: int,
                  super_scales=None) -> tuple[str, tuple] | None:
    """The C++ op :func:`int4_matmul` runs for CPU rows (at most ``CPU_MAX_ROWS``) of ``dtype``
    with ``k`` columns: ``(name of a torch.ops.localchat_cpu op, its arguments with INPUT for
    x)``, or None where the reference runs. Two-level scales the kernels do not read in
    place are folded here (once per call of this function)."""
    if not (qweight.dtype == torch.uint8 and qweight.dim() == 2 and group_size % 32 == 0
            and k == 2 * qweight.shape[1] and k % group_size == 0
            and scales.shape == mins.shape == (qweight.shape[0], k // group_size)):
        return None
    cpu = _cpu()
    if cpu is None:
        return None
    isa = cpu.active_isa()
    if super_scales is not None and not _kscales_ok(qweight, scales, mins, super_scales,
                                                    group_size):
        scales, mins = reference.fold_kscales(scales, mins, super_scales)
        super_scales = None
    ok = super_scales is not None or _scales_ok(scales, mins)
    if cpu_a8_enabled(dtype) and _a8_group_ok(k, group_size, True) and ok \
            and qweight.is_contiguous():
        return "int4_matmul_a8", (INPUT, qweight, scales, mins, group_size, cpu.int4_a8_isa(),
                                  super_scales)
    if not ok:
        scales, mins = scales.float(), mins.float()
    return "int4_matmul", (INPUT, qweight, scales, mins, group_size, isa, super_scales)


def _kscales_ok(qweight, scales, mins, super_scales, group_size: int) -> bool:
    """Whether two-level int4 scales (``reference.fold_kscales``) are what the C++ kernels
    read in place: uint8 ``[N, K // 32]`` scales / mins, fp16 ``[N, K // 256, 2]``
    ``super_scales``, all contiguous, G = 32."""
    n, k = qweight.shape[0], 2 * qweight.shape[1]
    return (group_size == 32 and k % 256 == 0 and scales.dtype == mins.dtype == torch.uint8
            and super_scales.dtype == torch.float16
            and tuple(super_scales.shape) == (n, k // 256, 2)
            and scales.is_contiguous() and mins.is_contiguous()
            and super_scales.is_contiguous())


def int4_a8_layout_ok(qweight, scales, mins, group_size: int, super_scales=None) -> bool:
    """Whether a CPU int4 layer's buffers (``qweight [N, K // 2]`` uint8, ``scales`` /
    ``mins [N, K // G]``, optional two-level ``super_scales``) are what
    ``cpu.int4_matmul_a8`` reads in place, with the C++ kernels built: the checks
    :func:`int4_matmul` makes on every call, made once per layer so the decode path can call
    the op directly (``Int4LinearMethod.apply``)."""
    if not (qweight.is_cpu and qweight.dtype == torch.uint8 and qweight.dim() == 2
            and qweight.is_contiguous() and group_size % 32 == 0):
        return False
    k = 2 * qweight.shape[1]
    ok = (super_scales is None and _scales_ok(scales, mins)) or (
        super_scales is not None and _kscales_ok(qweight, scales, mins, super_scales,
                                                 group_size))
    return (k % group_size == 0 and _a8_group_ok(k, group_size, True)
            and scales.shape == mins.shape == (qweight.shape[0], k // group_size)
            and ok and _cpu() is not None)


def int4_matmul(x, qweight, scales, mins, group_size: int, super_scales=None):
    """See ``reference.int4_matmul`` (``w = q * scales + mins`` group-wise; with
    ``super_scales`` the two-level scales of ``reference.fold_kscales``). On CPU for up to
    ``CPU_MAX_ROWS`` rows: where :func:`cpu_a8_enabled` (16-bit ``x`` by default) the W4A8
    integer-dot kernel (``reference.int4_matmul_a8``; fp32, fp16 or two-level scales/mins),
    else the exact fp32-activation kernel."""
    if _use_triton(x):
        if super_scales is not None:
            scales, mins = reference.fold_kscales(scales, mins, super_scales)
        return _triton("triton_quant").int4_matmul(x, qweight, scales, mins, group_size)
    call = cpu_int4_call(x.dtype, x.shape[-1], qweight, scales, mins, group_size,
                         super_scales) if _use_cpu(x) else None
    if call is not None:
        name, args = call
        return getattr(torch.ops.localchat_cpu, name)(x, *args[1:])
    return reference.int4_matmul(x, qweight, scales, mins, group_size, super_scales)
