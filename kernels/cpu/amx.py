"""Wrappers of the CPU extension's AMX prefill GEMM (``kernels/cpu/amx.h``, ``strip_gemm.cpp``,
``amx_bf16.cpp``): ``x [M, K]`` bf16 times a quantized weight whose rows are dequantized to
bf16, 32 at a time, into a per-thread strip that stays in the core's L2 cache, then multiplied
on the AMX tile unit (``tdpbf16ps``, fp32 accumulation). The weight is read once in its
quantized form; the row-block route (``engine/quant/cpu_prefill.py``) instead writes whole
dequantized layers to memory for ``torch.mm`` to read back. Re-exported by
``localchat.kernels.cpu``; call them through it. The reference is the dequantized weight's
``torch.mm`` (``reference.dequantize_*`` then an fp32-accumulating bf16 GEMM).

Only on CPUs with AMX-TILE, AMX-BF16 and AVX512-BF16 whose kernel grants the process the
tile state (:func:`has_amx`); ``LOCALCHAT_CPU_AMX=0`` (or ``LOCALCHAT_CPU_ISA`` below
``avx512``) turns it off (:func:`amx_enabled`), for A/B runs and to test the other route."""

from __future__ import annotations

import functools
import os

from . import _ops, active_isa, available

AMX_ENV = "LOCALCHAT_CPU_AMX"
# "1" runs the W4A8 int4 matmuls of decode and verification rows on the AMX-INT8 tile unit
# (kernels/cpu/qa8_amx.cpp) instead of VNNI; off by default (amx_decode_enabled).
AMX_DECODE_ENV = "LOCALCHAT_CPU_AMX_DECODE"
# The ISA level that asks int4_matmul_a8 for the AMX-INT8 kernel (kAmxInt8 in qa8.h).
AMX_INT8_LEVEL = 3


@functools.cache
def has_amx() -> bool:
    """Whether this CPU and OS run the AMX bf16 kernel (False without the C++ kernels, on a
    CPU without AMX, or where the kernel refuses the tile state). Decided once per process."""
    return available() and bool(_ops().has_amx())


@functools.cache
def amx_enabled() -> bool:
    """:func:`has_amx`, unless ``LOCALCHAT_CPU_AMX`` is ``0`` / ``false`` / ``off`` or
    ``LOCALCHAT_CPU_ISA`` caps the ISA below AVX-512. Read once per process (call
    ``amx_enabled.cache_clear()`` after changing either variable)."""
    return not _amx_off() and has_amx() and active_isa() >= 2


def _amx_off() -> bool:
    """``LOCALCHAT_CPU_AMX`` is 0 / false / off / no: no AMX path at all."""
    return os.environ.get(AMX_ENV, "").strip().lower() in ("0", "false", "off", "no")


@functools.cache
def has_amx_int8() -> bool:
    """Whether this CPU and OS run the AMX-INT8 W4A8 kernel (AMX-TILE, AMX-INT8 and AVX-512
    VNNI, the tile state granted; False without the C++ kernels). Decided once per process."""
    return available() and bool(_ops().has_amx_int8())


@functools.cache
def amx_decode_enabled() -> bool:
    """Whether the int4 W4A8 matmuls of up to 16 rows run on the AMX-INT8 tile unit:
    ``LOCALCHAT_CPU_AMX_DECODE=1`` on a CPU with :func:`has_amx_int8`, unless
    ``LOCALCHAT_CPU_AMX`` is off or ``LOCALCHAT_CPU_ISA`` caps the ISA below AVX-512. Off by
    default: the kernel's cost per extra row is small (a 16-row call about 1.4x a 1-row one,
    VNNI's 6-7x) but its 1-row call is 2-3x VNNI's, which decode pays on every step (README,
    "AMX-INT8 for verification rows"). Read once per process
    (``localchat.kernels.refresh_env()`` re-reads it)."""
    if os.environ.get(AMX_DECODE_ENV, "").strip().lower() not in ("1", "true", "on", "yes"):
        return False
    return not _amx_off() and has_amx_int8() and active_isa() >= 2


def int4_a8_isa() -> int:
    """The ISA level to pass ``int4_matmul_a8``: :data:`AMX_INT8_LEVEL` where
    :func:`amx_decode_enabled`, else :func:`localchat.kernels.cpu.active_isa`. One kernel
    serves every row count of a process, so row i of an M-row call equals the 1-row call
    (batch invariance) whichever it is."""
    return AMX_INT8_LEVEL if amx_decode_enabled() else active_isa()


def int4_dequant_mm(x, qweight, scales, mins, group_size: int, super_scales=None):
    """``x [M, K]`` bf16 (contiguous) @ the int4 weight (``int4_dequantize``'s arguments; group
    size a multiple of 32) -> ``[M, N]`` bf16: each weight row dequantized to the bf16 values
    ``int4_dequantize`` writes, fp32 accumulation in the tile unit's order, one rounding to
    bf16. Needs :func:`has_amx`; raises ``RuntimeError`` otherwise or on a bad shape, dtype
    or layout."""
    return _ops().int4_dequant_mm(x, qweight, scales, mins, group_size, super_scales)


def int8_dequant_mm(x, qweight, scales, mins, group_size: int):
    """:func:`int4_dequant_mm` for the group-wise int8 weight (``int8_dequantize``'s
    arguments: ``qweight`` int8 ``[N, K]``, fp32 / fp16 ``scales`` / ``mins`` ``[N, K //
    group_size]``, ``mins`` may be None; 1-D ``[N]`` scales are per channel)."""
    if scales.dim() == 1:
        scales = scales[:, None]
        mins = None if mins is None else mins.reshape(-1, 1)
    return _ops().int8_dequant_mm(x, qweight, scales, mins, group_size)


def int5_dequant_mm(x, qlow, qhigh, scales):
    """:func:`int4_dequant_mm` for the int5 layout (GGUF Q5_0; ``int5_dequantize``'s
    arguments)."""
    return _ops().int5_dequant_mm(x, qlow, qhigh, scales)


def int6_dequant_mm(x, qlow, qhigh, scales, super_scales):
    """:func:`int4_dequant_mm` for the int6 layout (GGUF Q6_K; ``int6_dequantize``'s
    arguments)."""
    return _ops().int6_dequant_mm(x, qlow, qhigh, scales, super_scales)
