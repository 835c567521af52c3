"""Wrappers of the CPU extension's low-bit GGUF layouts: int6 (Q6_K held exactly,
``engine/quant/int6_layout.py``, ``kernels/cpu/qa6*.cpp``) and int5 (Q5_0 held exactly,
``engine/quant/int5_layout.py``, ``kernels/cpu/qa5*.cpp``). Re-exported by
``localchat.kernels.cpu``; call them through it. References: ``reference_int6.py``,
``reference_int5.py``."""

from __future__ import annotations

from . import _isa, _ops


def int6_matmul_a8(x, qlow, qhigh, scales, super_scales, isa: int | None = None):
    """W6A8 over the int6 layout (GGUF Q6_K held exactly; ``kernels/cpu/qa6.h``,
    ``localchat.engine.quant.int6_layout``): ``x [M, K]`` fp32/bf16/fp16 (any M; meant for
    decode, M <= 16) quantized per row and 32-column block to int8 (the int4 activation layout
    of :func:`int4_matmul_a8`), exact integer dots with ``q = u - 32`` (the -32 folded into
    each lane's start as -32 x the lane's activation sum), per 8 columns times
    ``(d * sc) * dact`` and summed in fp32 -> ``[M, N]`` in ``x.dtype``
    (``reference.int6_matmul_a8``'s math, another fixed fp32 order). Weights: ``qlow`` uint8
    ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 4]``, ``scales`` int8 ``[N, K // 16]``,
    ``super_scales`` fp16 ``[N, K // 256]``, all contiguous, ``K % 256 == 0``. Batch invariant
    (row i of an M-row call equals the 1-row call bit for bit) and thread invariant (threads
    split output columns). ISA level 2 = AVX-512 VNNI where present, else the AVX2
    ``maddubs`` path; 1 AVX2; 0 scalar. Design after llama.cpp's Q6_K x Q8_K dot product
    (own code). Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int6_matmul_a8(x, qlow, qhigh, scales, super_scales, _isa(isa))


def int6_matmul(x, qlow, qhigh, scales, super_scales, isa: int | None = None):
    """``x [M, K]`` (fp32/bf16/fp16, widened to fp32) @ the int6 weights (as in
    :func:`int6_matmul_a8`), exact fp32 activations: each weight dequantized to its exact fp32
    value, one fma per weight into a fixed set of vector accumulators per (row, column) in k
    order (``qa6.h``), a fixed reduction -> ``[M, N]`` in ``x.dtype``; batch and thread
    invariant. For CPUs without bf16,
    where activations stay fp32. Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int6_matmul(x, qlow, qhigh, scales, super_scales, _isa(isa))


def int6_dequantize(qlow, qhigh, scales, super_scales, out, isa: int | None = None) -> None:
    """``out [N, K]`` fp32 or bf16 (contiguous, written in place) <- the int6 weights'
    values ``(u - 32) * (d * sc)``, one fp32 rounding (``reference.dequantize_int6``, equal to
    ``gguf.quants.dequantize`` of the Q6_K source bit for bit), rounded once to nearest even
    for a bf16 ``out``; for the row blocks of a prefill GEMM. AVX-512 / AVX2 / scalar paths,
    threads over rows. Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    _ops().int6_dequantize(qlow, qhigh, scales, super_scales, out, _isa(isa))


def gguf_repack_q6(raw, qlow, qhigh, scales, super_scales, rows=None) -> None:
    """Repack a GGUF Q6_K tensor's blocks onto the int6 layout, in place (``qa6_ops.cpp``):
    ``raw`` contiguous 1-D uint8 (``S`` source rows of ``K // 256`` blocks of 210 bytes),
    ``qlow`` / ``qhigh`` / ``scales`` / ``super_scales`` as in :func:`int6_matmul_a8`
    (contiguous, ``N`` rows), ``rows`` (optional int64 ``[N]``): output row ``r`` takes source
    row ``rows[r]`` (without it ``S == N``), as :func:`gguf_repack`. Equal bit for bit to the
    numpy ``localchat.engine.quant.int6_layout.repack_q6_k`` (its reference and the fallback
    without a compiler). Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    _ops().gguf_repack_q6(raw, qlow, qhigh, scales, super_scales, rows)


def int5_matmul_a8(x, qlow, qhigh, scales, isa: int | None = None):
    """W5A8 over the int5 layout (GGUF Q5_0 held exactly; ``kernels/cpu/qa5.h``,
    ``localchat.engine.quant.int5_layout``): ``x [M, K]`` fp32/bf16/fp16 (any M; meant for
    decode, M <= 16) quantized per row and 32-column block to int8 (the int4 activation layout
    of :func:`int4_matmul_a8`), exact integer dots with ``q = u - 16`` (the -16 folded into
    each lane's start as -16 x the lane's activation sum), per 8 columns times ``d * dact`` and
    summed in fp32 -> ``[M, N]`` in ``x.dtype`` (``reference.int5_matmul_a8``'s math, another
    fixed fp32 order). Weights: ``qlow`` uint8 ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 8]``,
    ``scales`` fp16 ``[N, K // 32]``, all contiguous, ``K % 128 == 0``. Batch invariant (row i
    of an M-row call equals the 1-row call bit for bit) and thread invariant (threads split
    output columns). ISA level 2 = AVX-512 VNNI where present, else the AVX2 ``maddubs``
    path; 1 AVX2; 0 scalar. Design after llama.cpp's Q5_0 x Q8_0 dot product (own code).
    Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int5_matmul_a8(x, qlow, qhigh, scales, _isa(isa))


def int5_matmul(x, qlow, qhigh, scales, isa: int | None = None):
    """``x [M, K]`` (fp32/bf16/fp16, widened to fp32) @ the int5 weights (as in
    :func:`int5_matmul_a8`), exact fp32 activations: each weight dequantized to its exact fp32
    value, one fma per weight into a fixed set of vector accumulators per (row, column) in k
    order (``qa5.h``), a fixed reduction -> ``[M, N]`` in ``x.dtype``; batch and thread
    invariant. Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int5_matmul(x, qlow, qhigh, scales, _isa(isa))


def int5_dequantize(qlow, qhigh, scales, out, isa: int | None = None) -> None:
    """``out [N, K]`` fp32 or bf16 (contiguous, written in place) <- the int5 weights' values
    ``(u - 16) * d`` (exact; ``reference.dequantize_int5``, equal to ``gguf.quants.dequantize``
    of the Q5_0 source bit for bit), rounded once to nearest even for a bf16 ``out``; for the
    row blocks of a prefill GEMM. AVX-512 / AVX2 / scalar paths, threads over rows.
    Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    _ops().int5_dequantize(qlow, qhigh, scales, out, _isa(isa))


def gguf_repack_q5(raw, qlow, qhigh, scales, rows=None) -> None:
    """Repack a GGUF Q5_0 tensor's blocks onto the int5 layout, in place (``qa5_ops.cpp``):
    ``raw`` contiguous 1-D uint8 (``S`` source rows of ``K // 32`` blocks of 22 bytes),
    ``qlow`` / ``qhigh`` / ``scales`` as in :func:`int5_matmul_a8` (contiguous, ``N`` rows),
    ``rows`` (optional int64 ``[N]``): output row ``r`` takes source row ``rows[r]`` (without
    it ``S == N``). Equal byte for byte to the numpy
    ``localchat.engine.quant.int5_layout.repack_q5_0`` (its reference). Raises
    ``RuntimeError`` on a bad shape, dtype or layout."""
    _ops().gguf_repack_q5(raw, qlow, qhigh, scales, rows)
