"""localchat's C++ CPU kernels (``torch.ops.localchat_cpu``), built on first use.

The sources in this folder are compiled with ``torch.utils.cpp_extension`` into the user cache
(``$LOCALCHAT_HOME/cache/kernels/...`` or platformdirs' ``user_cache_dir("localchat")``) the
first time an op is needed, with a one-line note on stderr; later processes load the built
library. Each ISA path is its own translation unit compiled for that ISA (``#pragma GCC
target``): AVX-512 (F/BW/VL/DQ), AVX2 + FMA, and portable scalar code, chosen per call from the
CPU's flags. ``LOCALCHAT_CPU_ISA`` (``avx512``, ``avx2`` or ``scalar``) caps the choice, e.g.
to run the AVX2 path on an AVX-512 machine; a request above what the CPU has is clamped. It is
read once per process (:func:`active_isa`).

Without a compiler (or ninja), or when the build fails, :func:`available` is False after one
line on stderr saying so, and ``localchat.kernels`` runs the PyTorch references instead (the
build and its cache folder: ``build.py``).
``LOCALCHAT_KERNELS=reference`` skips the build entirely.

Ops (shapes and contracts as in ``localchat.kernels.reference``):
``int4_matmul(x, qweight, scales, mins, group_size, isa)`` and
``int8_matmul(x, qweight, scales, mins, group_size, isa)`` (exact fp32 activations), and the
integer-dot ``int4_matmul_a8`` / ``int8_matmul_a8`` (activations quantized per 32 columns to
int8; ``reference.int4_matmul_a8``): at the ``avx512`` level they use AVX-512 VNNI
(``vpdpbusd``) when the CPU has it (:func:`has_vnni`) and the AVX2 ``maddubs`` path otherwise;
``int4_matmul_a8`` at level :data:`AMX_INT8_LEVEL` (:func:`int4_a8_isa`, opt-in) runs the
AMX-INT8 tile kernel where the CPU has it (``amx.py``).
``int4_dequantize`` / ``int8_dequantize`` write blocks of dequantized weight rows (fp32 or bf16)
for the prefill GEMMs (``localchat.engine.quant.cpu_prefill``). ``gguf_repack`` moves a GGUF
tensor's blocks onto the int4 / int8 layouts (``localchat.engine.quant.gguf_repack``, whose numpy
path is its reference). The int6 layout (GGUF Q6_K held exactly, ``qa6.h``) has
``int6_matmul_a8`` / ``int6_matmul`` / ``int6_dequantize`` and its repack ``gguf_repack_q6``;
the int5 layout (GGUF Q5_0 held exactly, ``qa5.h``) ``int5_matmul_a8`` / ``int5_matmul`` /
``int5_dequantize`` and ``gguf_repack_q5``. The int4, int5, int6 and int8 panel layouts (16
outputs interleaved, ``panel{4,5,6,8}.h``; ``localchat.engine.quant.int{4,5,6,8}_panel``) have
``int{4,5,6,8}_panel_a8`` (any row count), their conversions ``int{4,5,6,8}_to_panel`` and,
for a prompt's GEMM, ``int{4,5,8}_panel_dequantize``; the int6 and int8 panels
``int{6,8}_panel_gather``, single rows by id (the greedy head's candidates); the one-level
int4, the int5 and the int8 panels also ``int{4,5,8}_panel_f32``, exact fp32 matmuls for rows
whose activations stay fp32 (``panel.py``). On AMX CPUs ``int{4,5,6,8}_dequant_mm`` run a
prefill GEMM on the tile unit over weight rows dequantized in cache (``amx.py``).
"""

from __future__ import annotations

import functools
import os

import torch

from .build import SOURCES, available, build_dir  # noqa: F401  (the package's API; build.py)

ISA_ENV = "LOCALCHAT_CPU_ISA"
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}


@functools.cache
def best_isa() -> int:
    """The widest ISA path this CPU runs (0 scalar, 1 AVX2, 2 AVX-512)."""
    return int(_ops().best_isa())


@functools.cache
def active_isa() -> int:
    """The ISA path calls take: :func:`best_isa`, capped by ``LOCALCHAT_CPU_ISA``. Read once
    per process (the ops consult it on every call): after changing the variable call
    ``active_isa.cache_clear()`` (or ``localchat.kernels.refresh_env()``).

    Raises ``localchat.engine.errors.SettingError`` (a ``ValueError``) for an unknown
    ``LOCALCHAT_CPU_ISA`` value."""
    want = os.environ.get(ISA_ENV, "").strip().lower()
    if not want:
        return best_isa()
    if want not in ISAS:
        from localchat.engine.errors import SettingError

        raise SettingError(f"{ISA_ENV}={want!r} is not a setting: expected one of "
                           f"{', '.join(ISAS)} (or unset)")
    return min(ISAS[want], best_isa())


def isa_name(isa: int | None = None) -> str:
    """``"avx512"`` / ``"avx2"`` / ``"scalar"`` for ``isa`` (default: :func:`active_isa`)."""
    isa = active_isa() if isa is None else isa
    return {v: k for k, v in ISAS.items()}[isa]


def _ops():
    if not available():
        raise RuntimeError("localchat CPU kernels are not built (see the note above)")
    return torch.ops.localchat_cpu


def int4_matmul(x, qweight, scales, mins, group_size: int, isa: int | None = None,
                super_scales=None):
    """``x [M, K]`` fp32/bf16/fp16 @ int4 group-wise weights -> ``[M, N]`` in ``x.dtype``
    (``reference.int4_matmul``'s contract; ``group_size`` a multiple of 32; with
    ``super_scales`` fp16 ``[N, K // 256, 2]``, uint8 ``scales`` / ``mins``: the two-level
    form of ``reference.fold_kscales``, read in place, ``kernels/cpu/kscales.h``)."""
    return _ops().int4_matmul(
        x, qweight, scales, mins, group_size, active_isa() if isa is None else isa,
        super_scales)


def int8_matmul(x, qweight, scales, mins=None, group_size: int | None = None,
                isa: int | None = None):
    """``x [M, K]`` @ int8 group-wise weights -> ``[M, N]`` in ``x.dtype``
    (``reference.int8_matmul``'s contract; 1-D ``scales`` = per channel)."""
    if group_size is None:
        group_size = x.shape[-1] // (scales.shape[1] if scales.dim() == 2 else 1)
    return _ops().int8_matmul(
        x, qweight, scales, mins, group_size, active_isa() if isa is None else isa)


def int4_dequantize(qweight, scales, mins, group_size: int, out, super_scales=None,
                    isa: int | None = None) -> None:
    """``out [N, K]`` fp32 or bf16 (contiguous, written in place) <- ``q * scales + mins`` of
    int4 ``qweight [N, K // 2]`` (contiguous ``scales`` / ``mins [N, K // G]``, fp32 or fp16,
    or uint8 with two-level ``super_scales`` fp16 ``[N, K // 256, 2]``): the values the
    matmuls dequantize to (``reference.dequantize_int4``'s, exact for GGUF scales; rounded
    once to bf16 for a bf16 ``out``), for the row blocks of a prefill GEMM. ISA paths
    AVX-512 / AVX2 (G a multiple of 32) / scalar, the same bits on each (``isa`` None =
    :func:`active_isa`); threads over rows. Raises ``RuntimeError`` on a bad layout."""
    _ops().int4_dequantize(qweight, scales, mins, group_size, out, super_scales,
                           active_isa() if isa is None else isa)


def int8_dequantize(qweight, scales, mins, group_size: int, out, isa: int | None = None) -> None:
    """``out [N, K]`` fp32 or bf16 (contiguous, written in place) <- ``q * scales (+ mins)``
    of int8 ``qweight [N, K]`` (contiguous ``scales`` / ``mins [N, K // group_size]``, fp32 or
    fp16, ``mins`` may be None; 1-D ``[N]`` scales are per channel): equal bit for bit to
    ``reference.dequantize_int8`` (product then sum, each rounded once in fp32), and for a bf16
    ``out`` to that rounded to nearest even. ISA paths AVX-512 / AVX2 / scalar as the other
    ops (``isa`` None = :func:`active_isa`), threads over rows (``at::parallel_for``). For the
    row blocks of a prefill GEMM (``localchat.engine.quant.cpu_prefill``).
    Raises ``RuntimeError`` on a bad shape, dtype or layout."""
    if scales.dim() == 1:
        scales = scales[:, None]
        mins = None if mins is None else mins.reshape(-1, 1)
    _ops().int8_dequantize(qweight, scales, mins, group_size, out,
                           active_isa() if isa is None else isa)


def release_thread_pool() -> bool:
    """End the calling thread's OpenMP worker threads (``omp_pause_resource_all``); its next
    parallel region starts new ones. For a thread that hands the compute to another (the
    main thread after loading, before ``AsyncLLMEngine``'s engine thread decodes): libgomp
    spins a waiting worker only 100 iterations, not ~300k, while it manages more threads
    than there are CPUs, so two live teams on a 2-core machine would put every worker to
    sleep between kernels (the engine thread's decode step measured 15-20% slower). Returns
    False where the extension is not built or OpenMP is not compiled in."""
    return available() and bool(torch.ops.localchat_cpu.release_thread_pool())


@functools.cache
def has_vnni() -> bool:
    """True when this CPU has AVX-512 VNNI (``vpdpbusd``), which the integer-dot kernels use
    at the ``avx512`` ISA level (without it they take the AVX2 ``maddubs`` path)."""
    return bool(_ops().has_vnni())


def a8_quantize(x, int4: bool, isa: int | None = None):
    """The integer-dot kernels' activation quantizer alone (for tests): ``x [M, K]`` fp32 /
    bf16 (``K % 32 == 0``) -> ``(xq [M, Kp]`` int8 in the kernels' int4 or int8 layout
    (``qa8.h``; ``Kp`` = K rounded up to 128, zero padded), ``d [M, Kp // 32]`` fp32). Raises
    ``RuntimeError`` on a bad input."""
    return _ops().a8_quantize(x, int4, active_isa() if isa is None else isa)


def int4_matmul_a8(x, qweight, scales, mins, group_size: int, isa: int | None = None,
                   super_scales=None):
    """W4A8: ``x [M, K]`` (fp32/bf16/fp16, ``K % 32 == 0``) quantized per row and 32-column
    block to int8, integer dot products with int4 group-wise weights -> ``[M, N]`` in
    ``x.dtype`` (``reference.int4_matmul_a8``'s math; ``scales``/``mins`` fp32 or fp16
    ``[N, K // G]``, G a multiple of 32, or uint8 with two-level ``super_scales`` fp16
    ``[N, K // 256, 2]``, G = 32). ISA level 2 = AVX-512 VNNI where present, else AVX2.
    Raises ``RuntimeError`` on a bad layout."""
    return _ops().int4_matmul_a8(
        x, qweight, scales, mins, group_size, active_isa() if isa is None else isa,
        super_scales)


def int8_matmul_a8(x, qweight, scales, mins=None, group_size: int | None = None,
                   isa: int | None = None):
    """W8A8: ``x [M, K]`` @ int8 group-wise weights with int8-quantized activations
    (``reference.int8_matmul_a8``; G = 16 or a multiple of 32, 1-D ``scales`` = per channel).
    Raises ``RuntimeError`` on a bad layout."""
    if scales.dim() == 1:
        scales = scales[:, None]
        mins = None if mins is None else mins.reshape(-1, 1)
    if group_size is None:
        group_size = x.shape[-1] // scales.shape[1]
    return _ops().int8_matmul_a8(
        x, qweight, scales, mins, group_size, active_isa() if isa is None else isa)


def _isa(isa: int | None) -> int:
    return active_isa() if isa is None else isa


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale: float,
                           isa: int | None = None, bf16_dot: bool = True):
    """``reference.paged_attention_decode``'s contract, reading K/V in place through
    ``block_tables`` (online softmax in fp32, one thread per (sequence, kv head)); query and
    caches fp32/bf16/fp16 of one dtype, ``head_dim`` a multiple of 16 up to 256, at most 16
    query heads per kv head. With bf16 query and caches, a ``head_dim`` that is a multiple of
    32 and the avx512 level on a CPU with AVX512_BF16, the scores come from ``vdpbf16ps``
    over the bf16 rows (``attn_dot.cpp``; ``bf16_dot=False`` keeps the fp32 FMAs, for tests).
    Raises ``RuntimeError`` on other inputs."""
    return _ops().paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens,
                                         float(scale), _isa(isa), bf16_dot)


def paged_attention_verify(query, key_cache, value_cache, query_start_loc, seq_lens,
                           block_tables, scale: float, isa: int | None = None,
                           bf16_dot: bool = True):
    """``reference.prefill_attention``'s contract (causal query chunks over a cached prefix,
    ``query [num_tokens, H, D]``, ``query_start_loc [S + 1]``, ``seq_lens [S]``,
    ``block_tables [S, max_blocks]``), each query row computed by the decode tasks as the
    decode step at its position: equal to ``paged_attention_decode`` there bit for bit. Meant
    for short chunks (speculative verification); cost grows with query rows x context.
    ``bf16_dot`` as for ``paged_attention_decode``.
    Raises ``RuntimeError`` on inputs ``paged_attention_decode`` rejects or inconsistent
    ``query_start_loc`` / ``seq_lens``."""
    return _ops().paged_attention_verify(query, key_cache, value_cache, query_start_loc,
                                         seq_lens, block_tables, float(scale), _isa(isa),
                                         bf16_dot)


def store_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """``reference.store_kv_cache`` (in place; ``-1`` slots skipped; contiguous caches of the
    keys' dtype)."""
    _ops().store_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def rms_norm(x, weight, eps: float, isa: int | None = None):
    """``reference.rms_norm`` for ``weight`` of ``x``'s dtype (fp32 arithmetic)."""
    return _ops().rms_norm(x, weight, float(eps), _isa(isa))


def fused_add_rms_norm(x, residual, weight, eps: float, isa: int | None = None):
    """``reference.fused_add_rms_norm``, out of place: ``(rms_norm(x + residual), x +
    residual)``."""
    return _ops().fused_add_rms_norm(x, residual, weight, float(eps), _isa(isa))


def apply_rope(positions, query, key, cos_sin_cache, isa: int | None = None):
    """``reference.apply_rope`` (neox layout), out of place; returns contiguous ``(q, k)``."""
    return _ops().apply_rope(positions, query, key, cos_sin_cache, _isa(isa))


def silu_and_mul(x, isa: int | None = None):
    """``reference.silu_and_mul``: ``x [T, 2I] -> silu(x[:, :I]) * x[:, I:]`` ``[T, I]``."""
    return _ops().silu_and_mul(x, _isa(isa))


def float_matmul(x, weight, bias=None, isa: int | None = None):
    """``x [M, K]`` (fp32/bf16/fp16) @ ``weight [N, K]``.T (+ ``bias [N]``) -> ``[M, N]`` in
    ``x.dtype``: fp32/bf16/fp16 weights widened exactly, fp32 accumulation in an order that
    depends only on K (one W-lane accumulator per output, a fixed reduction tree; fmm.h), the
    bias added in fp32 before the one rounding. Batch invariant (row i of an M-row call equals
    the 1-row call bit for bit) and thread invariant; each weight row read once for all M rows
    (meant for M <= ``localchat.kernels.CPU_MAX_ROWS``). bf16 weights sum in the pair order of
    AVX512_BF16's ``vdpbf16ps`` with FMAs, denormals flushed like the instruction (the op's
    ``bf16_dot`` flag runs the instruction itself where :func:`has_bf16_dot`: the same bits,
    measured no faster on this project's machine, so not used). Raises ``RuntimeError`` on
    other dtypes or mismatched shapes."""
    return _ops().float_matmul(x, weight, bias, _isa(isa), False)


@functools.cache
def has_bf16_dot() -> bool:
    """True when this CPU has AVX512_BF16 (``vdpbf16ps``; the op ``float_matmul(..., bf16_dot=
    True)`` uses it at the ``avx512`` level for bf16 x bf16, the same bits as the FMA tiles)."""
    return bool(_ops().has_bf16_dot())


def float_matmul_t(x, weight_t, bias=None, isa: int | None = None):
    """``x [M, K]`` (fp32/bf16/fp16) @ ``weight_t [K, N]`` (fp32, the transposed copy CPU
    fp32 layers keep) (+ ``bias [N]``) -> ``[M, N]`` in ``x.dtype``: each output summed over
    k = 0..K-1 in order, one fma per k (fmm.h), so batch and thread invariant like
    :func:`float_matmul`. Raises ``RuntimeError`` on other dtypes or mismatched shapes."""
    return _ops().float_matmul_t(x, weight_t, bias, _isa(isa))


# GGML types the C++ repack takes (``repack_ops.cpp``): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
# Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL
GGUF_REPACK_TYPES = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20})


def gguf_repack(raw, ggml_type: int, qweight, scales, mins=None, rows=None,
                super_scales=None) -> int:
    """Repack GGUF blocks onto the engine's int4 / int8 layout, in place (``repack_ops.cpp``).

    ``raw``: contiguous 1-D uint8, ``S`` source rows of ``K / block`` blocks of GGML type
    ``ggml_type`` (one of :data:`GGUF_REPACK_TYPES`); ``qweight``: contiguous uint8
    ``[N, K // 2]`` (int4 types: Q4_0, Q4_1, Q4_K) or int8 ``[N, K]``; ``scales`` (and
    ``mins`` for Q4_0, Q4_1, Q4_K, Q5_1, Q5_K, Q2_K, else None): contiguous ``[N, K // G]``,
    fp16 for the types with fp16 block scales, fp32 for the K-quants
    (``localchat.engine.quant.gguf_repack``'s module docstring has the layouts, G and the scale
    rules); ``rows`` (optional int64 ``[N]``): output row ``r`` takes source row ``rows[r]``
    (without it ``S == N``); ``super_scales`` (Q4_K only, optional): fp16
    ``[N, K // 256, 2]``, and then ``scales`` / ``mins`` uint8: the two-level form
    (``reference.fold_kscales``). Threads over rows (``at::parallel_for``); portable scalar code
    (memory bound), no ISA paths. The values equal the numpy path of
    ``engine.quant.gguf_repack.repack_gguf_tensor`` bit for bit (its reference and oracle).
    Returns how many scale / min values an fp16 store changed (Q4_0's ``-8 d`` beyond the fp16
    range: the caller's corrupt-file error). Raises ``RuntimeError`` on an unsupported type or
    a bad shape, dtype or layout."""
    return int(_ops().gguf_repack(raw, int(ggml_type), qweight, scales, mins, rows,
                                  super_scales))


# The int6 (GGUF Q6_K) and int5 (GGUF Q5_0) ops' wrappers live in lowbit.py (they call _ops
# and _isa above), re-exported here.
from . import lowbit as _lowbit

gguf_repack_q5 = _lowbit.gguf_repack_q5
gguf_repack_q6 = _lowbit.gguf_repack_q6
int5_dequantize = _lowbit.int5_dequantize
int5_matmul = _lowbit.int5_matmul
int5_matmul_a8 = _lowbit.int5_matmul_a8
int6_dequantize = _lowbit.int6_dequantize
int6_matmul = _lowbit.int6_matmul
int6_matmul_a8 = _lowbit.int6_matmul_a8

# The panel layouts' matmuls and conversions live in panel.py, re-exported here.
from . import panel as _panel

int4_panel_a8 = _panel.int4_panel_a8
int4_to_panel = _panel.int4_to_panel
int4_panel_dequantize = _panel.int4_panel_dequantize
int5_panel_a8 = _panel.int5_panel_a8
int5_to_panel = _panel.int5_to_panel
int5_panel_dequantize = _panel.int5_panel_dequantize
int5_panel_f32 = _panel.int5_panel_f32
int6_panel_a8 = _panel.int6_panel_a8
int6_to_panel = _panel.int6_to_panel
int6_panel_gather = _panel.int6_panel_gather
int8_panel_a8 = _panel.int8_panel_a8
int8_to_panel = _panel.int8_to_panel
int8_panel_dequantize = _panel.int8_panel_dequantize
int8_panel_gather = _panel.int8_panel_gather
int4_panel_f32 = _panel.int4_panel_f32
int8_panel_f32 = _panel.int8_panel_f32

# The AMX prefill GEMM's wrappers live in amx.py, re-exported here.
from . import amx as _amx

amx_enabled = _amx.amx_enabled
has_amx = _amx.has_amx
has_amx_int8 = _amx.has_amx_int8
amx_decode_enabled = _amx.amx_decode_enabled
int4_a8_isa = _amx.int4_a8_isa
AMX_INT8_LEVEL = _amx.AMX_INT8_LEVEL
int4_dequant_mm = _amx.int4_dequant_mm
int5_dequant_mm = _amx.int5_dequant_mm
int6_dequant_mm = _amx.int6_dequant_mm
int8_dequant_mm = _amx.int8_dequant_mm
