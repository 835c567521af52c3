"""Wrappers of the CPU extension's panel-layout matmuls and conversions: int4
(``kernels/cpu/panel4.h``, ``panel4_{scalar,vnni}.cpp``; the layout's PyTorch conversions are
``localchat.engine.quant.int4_panel``), int5 (``panel5.h``, ``panel5_{scalar,avx2}.cpp``;
``localchat.engine.quant.int5_panel``), int6 (``panel6.h``, ``panel6_{scalar,vnni}.cpp``;
``localchat.engine.quant.int6_panel``) and int8 (``panel8.h``, ``panel8_{scalar,vnni}.cpp``;
``localchat.engine.quant.int8_panel``), all converted (and dequantized back to rows for a
prompt's GEMM) by ``panel_repack.cpp`` (int5: ``panel5_repack.cpp``); the exact fp32 matmuls
of the one-level int4, the int5 and the int8 panels in ``panelf.h``,
``panelf_{scalar,avx2}.cpp``. Re-exported by ``localchat.kernels.cpu``; call them through
it."""

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
    (``panel_repack.cpp``). Raises ``RuntimeError`` on a bad shape or dtype."""
    _ops().int4_to_panel(qweight, scales, mins, super_scales, qpanel, pscales, pmins, psuper)


def int4_panel_dequantize(qpanel, pscales, pmins, row0: int, out, isa: int | None = None) -> None:
    """``out [R, K]`` fp32 or bf16 (contiguous, written in place) <- rows ``[row0, row0 + R)``
    of a one-level (Q4_0 / Q4_1) int4 panel weight (``qpanel`` uint8 ``[N/16, K/8, 64]``,
    ``pscales`` / ``pmins`` fp16 ``[N/16, K/32, 16]``, as :func:`int4_panel_a8`), ``row0`` and
    ``R`` multiples of 16: the values :func:`int4_dequantize` writes
    for the row layout, bit for bit (each tile is turned back into rows and dequantized by
    that kernel; ``panel_repack.cpp``), for a prompt's GEMM. Raises ``RuntimeError`` on a bad
    shape, dtype or row range."""
    _ops().int4_panel_dequantize(qpanel, pscales, pmins, row0, out, _isa(isa))


def int6_panel_a8(x, plow, phigh, pscales, psuper, isa: int | None = None):
    """W6A8 over int6 (GGUF Q6_K) weights in the panel layout: ``x [M, K]`` fp32/bf16/fp16
    (any M, K % 256 == 0) quantized per row and 32-column block to int8 (Q8_0-style, as
    :func:`int4_panel_a8`), then for every output ``(m, n)`` and 32-column group ``g`` in
    order: ``acc = fma(float(isum), d * d_act, acc)`` with ``isum`` the exact int32 sum over
    the group's two 16-column sub-blocks of ``sc * (dot(u, xq) - 32 * sum(xq))`` -> ``[M, N]``
    in ``x.dtype`` (fp32 accumulation; the math of ``reference.int6_matmul_a8`` on the row
    layout, in this fixed order). Weights (N % 16 == 0; ``panel6.h``): ``plow`` uint8
    ``[N/16, K/8, 64]`` (the low nibbles of ``u = q + 32``), ``phigh`` uint8
    ``[N/16, K/16, 64]`` (its top two bits), ``pscales`` int8 ``[N/16, K/16, 16]``, ``psuper``
    fp16 ``[N/16, K/256, 16]``; all contiguous.

    Batch and thread invariant. ISA level 2 with VNNI runs ``panel6_vnni.cpp``; anything else
    the portable kernel (``panel6_scalar.cpp``, bit-equal, slow). Design after llama.cpp's
    interleaved K-quant GEMVs and its Q6_K x Q8 dot (own code). Raises ``RuntimeError`` on a
    bad shape, dtype or layout."""
    return _ops().int6_panel_a8(x, plow, phigh, pscales, psuper, _isa(isa))


def int6_to_panel(qlow, qhigh, scales, super_scales, plow, phigh, pscales, psuper) -> None:
    """Write the panel layout of an int6 weight in the row layout (``qlow`` uint8
    ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 4]``, ``scales`` int8 ``[N, K // 16]``,
    ``super_scales`` fp16 ``[N, K // 256]``) into the given contiguous tensors (shapes as in
    :func:`int6_panel_a8`): ``localchat.engine.quant.int6_panel.to_panel6``'s bytes, bit for
    bit, threads over tiles (``panel_repack.cpp``). Raises ``RuntimeError`` on a bad shape or
    dtype."""
    _ops().int6_to_panel(qlow, qhigh, scales, super_scales, plow, phigh, pscales, psuper)


def int5_panel_a8(x, plow, phigh, pscales, isa: int | None = None):
    """W5A8 over int5 (GGUF Q5_0) weights in the panel layout: ``x [M, K]`` fp32/bf16/fp16
    (any M, K % 32 == 0) quantized per row and 32-column block to int8 (Q8_0-style, as
    :func:`int4_panel_a8`), then for every output ``(m, n)`` and 32-column group ``g`` in
    order: ``acc = fma(float(idot), d * d_act, acc)`` with ``idot`` the exact int32
    ``dot(u, xq) - 16 * sum(xq)`` of the group (``u = q + 16``) -> ``[M, N]`` in ``x.dtype``
    (fp32 accumulation; the math of ``reference.int5_matmul_a8`` on the row layout, in this
    fixed order). Weights (N % 16 == 0; ``panel5.h``): ``plow`` uint8 ``[N/16, K/8, 64]``
    (the low nibbles of ``u``), ``phigh`` uint8 ``[N/16, K/32, 64]`` (its top bit),
    ``pscales`` fp16 ``[N/16, K/32, 16]``; all contiguous.

    Batch and thread invariant. ISA level >= 1 runs ``panel5_avx2.cpp`` (no VNNI kernel yet:
    AVX-512 CPUs run it too), level 0 the portable kernel (``panel5_scalar.cpp``, bit-equal,
    slow). Design after llama.cpp's interleaved Q4_0 GEMV and its Q5_0 x Q8_0 dot (own code).
    Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int5_panel_a8(x, plow, phigh, pscales, _isa(isa))


def int5_to_panel(qlow, qhigh, scales, plow, phigh, pscales) -> None:
    """Write the panel layout of an int5 weight in the row layout (``qlow`` uint8
    ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 8]``, ``scales`` fp16 ``[N, K // 32]``;
    ``kernels/cpu/qa5.h``, K % 128 == 0) into the given contiguous tensors (shapes as in
    :func:`int5_panel_a8`): ``localchat.engine.quant.int5_panel.to_panel5``'s bytes, bit for
    bit, threads over tiles (``panel5_repack.cpp``). Raises ``RuntimeError`` on a bad shape or
    dtype."""
    _ops().int5_to_panel(qlow, qhigh, scales, plow, phigh, pscales)


def int5_panel_dequantize(plow, phigh, pscales, row0: int, out, isa: int | None = None) -> None:
    """``out [R, K]`` fp32 or bf16 (contiguous, written in place) <- rows ``[row0, row0 + R)``
    of an int5 panel weight (as :func:`int5_panel_a8`, K % 128 == 0), ``row0`` and ``R``
    multiples of 16: the values :func:`int5_dequantize` writes for the row layout, bit for
    bit (each tile is turned back into rows and dequantized by that kernel;
    ``panel5_repack.cpp``), for a prompt's GEMM. Raises ``RuntimeError`` on a bad shape,
    dtype or row range."""
    _ops().int5_panel_dequantize(plow, phigh, pscales, row0, out, _isa(isa))


def int5_panel_f32(x, plow, phigh, pscales, isa: int | None = None):
    """Exact fp32 matmul over an int5 (GGUF Q5_0) panel weight: ``x [M, K]`` fp32/bf16/fp16
    (widened to fp32; any M, K % 32 == 0) -> ``[M, N]`` in ``x.dtype``, every output
    ``acc = fma(w[n, k], x[m, k], acc)`` for ``k = 0 .. K - 1`` in order from 0, ``w =
    (u - 16) * d`` (exact, :func:`int5_panel_dequantize`'s values). Weights as
    :func:`int5_panel_a8`'s. Batch and thread invariant, AVX2 and portable kernels bit-equal,
    as :func:`int4_panel_f32` (``panelf.h``). Raises ``RuntimeError`` on a bad shape, dtype
    or layout."""
    return _ops().int5_panel_f32(x, plow, phigh, pscales, _isa(isa))


def int8_panel_a8(x, qpanel, pscales, isa: int | None = None):
    """W8A8 over int8 (GGUF Q8_0) weights in the panel layout: ``x [M, K]`` fp32/bf16/fp16
    (any M, K % 32 == 0) quantized per row and 32-column block to int8 (Q8_0-style, as
    :func:`int4_panel_a8`), then for every output ``(m, n)`` and 32-column group ``g`` in
    order: ``acc = fma(float(dot), scale * d_act, acc)`` with the exact int32 dot of the
    group's 32 weights and activations -> ``[M, N]`` in ``x.dtype`` (fp32 accumulation; the
    math of ``reference.int8_matmul_a8`` on the row layout, in this fixed order). Weights
    (N % 16 == 0; ``panel8.h``): ``qpanel`` int8 ``[N/16, K/4, 64]`` (byte ``4 j + b`` of
    tile ``t``, quad ``c``: ``q[16 t + j, 4 c + b]``), ``pscales`` fp16 ``[N/16, K/32, 16]``;
    both contiguous.

    Batch and thread invariant. ISA level 2 with VNNI runs ``panel8_vnni.cpp``; anything else
    the portable kernel (``panel8_scalar.cpp``, bit-equal, slow). Design after llama.cpp's
    interleaved Q8_0 GEMV (``block_q8_0x4``) and oneDNN's VNNI weight panels (own code).
    Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int8_panel_a8(x, qpanel, pscales, _isa(isa))


def int8_to_panel(qweight, scales, qpanel, pscales) -> None:
    """Write the panel layout of a group-32 int8 weight (``qweight`` int8 ``[N, K]``,
    ``scales`` fp16 ``[N, K // 32]``) into the given contiguous tensors (shapes as in
    :func:`int8_panel_a8`): ``localchat.engine.quant.int8_panel.to_panel8``'s bytes, bit for
    bit, threads over tiles (``panel_repack.cpp``). Raises ``RuntimeError`` on a bad shape or
    dtype."""
    _ops().int8_to_panel(qweight, scales, qpanel, pscales)


def int8_panel_dequantize(qpanel, pscales, row0: int, out, isa: int | None = None) -> None:
    """``out [R, K]`` fp32 or bf16 (contiguous, written in place) <- rows ``[row0, row0 + R)``
    of an int8 panel weight (as :func:`int8_panel_a8`), ``row0`` and ``R`` multiples of 16:
    the values :func:`int8_dequantize` writes for the row layout, bit for bit (each tile is
    turned back into rows and dequantized by that kernel; ``panel_repack.cpp``), for a
    prompt's GEMM. Raises ``RuntimeError`` on a bad shape, dtype or row range."""
    _ops().int8_panel_dequantize(qpanel, pscales, row0, out, _isa(isa))


def int6_panel_gather(plow, phigh, pscales, psuper, ids, out) -> None:
    """``out [n, K]`` fp32 (contiguous, written in place) <- rows ``ids`` (int64 ``[n]``, any
    order, repeats allowed) of an int6 panel weight (as :func:`int6_panel_a8`): the values
    ``reference_int6.dequantize_int6`` gives the row layout, bit for bit, each read from its
    lane of the tile (``panel_gather.cpp``; 1/16 of the work of turning the whole tile back
    into rows), for the greedy output layer's rescored candidates. Raises ``RuntimeError`` on a bad
    shape or dtype or an id outside ``[0, N)``."""
    _ops().int6_panel_gather(plow, phigh, pscales, psuper, ids, out)


def int8_panel_gather(qpanel, pscales, ids, out) -> None:
    """``out [n, K]`` fp32 <- rows ``ids`` of an int8 panel weight (as :func:`int8_panel_a8`):
    ``q * scale``, the row layout's values bit for bit, as :func:`int6_panel_gather` (the
    greedy head's candidates, a tied Q8_0 embedding's lookups). Raises ``RuntimeError`` as
    it does."""
    _ops().int8_panel_gather(qpanel, pscales, ids, out)


def int4_panel_f32(x, qpanel, pscales, pmins, isa: int | None = None):
    """Exact fp32 matmul over a one-level (GGUF Q4_0 / Q4_1) int4 panel weight: ``x [M, K]``
    fp32/bf16/fp16 (widened to fp32; any M, K % 32 == 0) -> ``[M, N]`` in ``x.dtype``, every
    output ``acc = fma(w[n, k], x[m, k], acc)`` for ``k = 0 .. K - 1`` in order from 0, ``w``
    the values :func:`int4_panel_dequantize` writes (``fma(q, scale, min)``, exact). Weights as
    :func:`int4_panel_a8`'s one-level form (``qpanel`` uint8 ``[N/16, K/8, 64]``, fp16
    ``pscales`` / ``pmins`` ``[N/16, K/32, 16]``, contiguous).

    For the rows whose activations stay fp32 (an fp32 engine's short prompt steps and logits
    rows): the weights are unpacked in registers, no float copy of the layer. Batch and thread
    invariant; the AVX2 kernel (ISA level >= 1, ``panelf_avx2.cpp``) equals the portable one
    (``panelf_scalar.cpp``) bit for bit (``panelf.h``). Raises ``RuntimeError`` on a bad shape,
    dtype or layout."""
    return _ops().int4_panel_f32(x, qpanel, pscales, pmins, _isa(isa))


def int8_panel_f32(x, qpanel, pscales, isa: int | None = None):
    """Exact fp32 matmul over an int8 (GGUF Q8_0) panel weight: ``x [M, K]`` fp32/bf16/fp16
    (widened to fp32; any M, K % 32 == 0) -> ``[M, N]`` in ``x.dtype``, every output
    ``acc = fma(w[n, k], x[m, k], acc)`` for ``k = 0 .. K - 1`` in order from 0, ``w = q *
    scale`` (exact, :func:`int8_panel_dequantize`'s values). Weights as
    :func:`int8_panel_a8`'s (``qpanel`` int8 ``[N/16, K/4, 64]``, ``pscales`` fp16
    ``[N/16, K/32, 16]``). Batch and thread invariant, AVX2 and portable kernels bit-equal, as
    :func:`int4_panel_f32`. Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    return _ops().int8_panel_f32(x, qpanel, pscales, _isa(isa))
