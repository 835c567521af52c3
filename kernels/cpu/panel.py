"""Wrapper of the CPU extension's int4 panel-layout matmul (``kernels/cpu/panel4.h``,
``panel4_{scalar,vnni}.cpp``; the layout's conversions are ``localchat.engine.quant.int4_panel``).
Re-exported by ``localchat.kernels.cpu``; call it through it."""

from __future__ import annotations

from . import _isa, _ops


def int4_panel_a8(x, qpanel, pscales, pmins, psuper=None, isa: int | None = None):
    """W4A8 over int4 weights in the panel layout: ``x [M, K]`` fp32/bf16/fp16 (any M)
    quantized per row and 32-column block to int8 (the int8 activation layout of
    ``int8_matmul_a8``, Q8_0-style), then for every output ``(m, n)`` and 32-column group
    ``g`` in order: ``acc = fma(float(dot), scale * d_act, acc)``, ``acc = fma(min, xs, acc)``
    with the exact int32 dot of the group's 32 weights and activations -> ``[M, N]`` in
    ``x.dtype`` (fp32 accumulation; the math of ``reference.int4_matmul_a8`` on the row
    layout, in this fixed order). Weights (N % 16 == 0; ``panel4.h``): ``qpanel`` uint8
    ``[N/16, K/8, 64]``; two levels (GGUF Q4_K, K % 256 == 0): ``pscales`` / ``pmins`` uint8
    ``[N/16, K/32, 16]`` and ``psuper`` fp16 ``[N/16, K/256, 2, 16]`` (scale = sc * d, min =
    m * -dmin); one level (Q4_0 / Q4_1, K % 32 == 0): fp16 ``pscales`` / ``pmins``, no
    ``psuper``; all contiguous.

    Batch and thread invariant: row i of an M-row call equals the 1-row call bit for bit. ISA
    level 2 with VNNI runs ``panel4_vnni.cpp``; anything else the portable kernel
    (``panel4_scalar.cpp``, bit-equal to it, slow: for tests and CPUs without VNNI that are
    handed a panel weight). Design after llama.cpp's interleaved Q4_K GEMV and oneDNN's VNNI
    weight panels (own code). Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int4_panel_a8(x, qpanel, pscales, pmins, psuper, _isa(isa))


def int4_to_panel(qweight, scales, mins, super_scales, qpanel, pscales, pmins, psuper) -> None:
    """Write the panel layout of an int4 weight in the row layout into the given contiguous
    tensors (shapes as in :func:`int4_panel_a8`; the row layout's ``qweight`` uint8
    ``[N, K // 2]``, ``scales`` / ``mins`` ``[N, K // 32]``, uint8 with ``super_scales`` fp16
    ``[N, K // 256, 2]`` or fp16 with ``super_scales`` and ``psuper`` None):
    ``localchat.engine.quant.int4_panel.to_panel``'s bytes, bit for bit, threads over tiles
    (``panel4_repack.cpp``). Raises ``RuntimeError`` on a bad shape or dtype."""
    _ops().int4_to_panel(qweight, scales, mins, super_scales, qpanel, pscales, pmins, psuper)
