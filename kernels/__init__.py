"""Data-plane ops: Triton kernels on CUDA, C++ kernels on CPU (``cpu/``), PyTorch references
(``reference.py``) elsewhere.

Call the ops through this module so the dispatch stays in one place: a call whose first tensor
lives on a CUDA device runs the Triton launcher (``triton_*.py``, imported on first use); a CPU
call of an op that ``kernels/cpu`` implements (``int4_matmul``, ``int8_matmul`` for
``M <= CPU_MAX_ROWS`` rows; ``paged_attention_decode``, ``store_kv_cache``, ``rms_norm``,
``fused_add_rms_norm``, ``apply_rope``, ``silu_and_mul`` for fp32/bf16/fp16 tensors whose
shapes the C++ launchers take, see ``_cpu_ok``) runs the C++ kernel, built on first use (one stderr line; if it
cannot be built, one line says so and the reference runs); anything else runs the reference.
With 16-bit activations those CPU matmuls quantize activations to int8 and use integer dot
products (W4A8 / W8A8, ``reference.int4_matmul_a8``; :func:`cpu_a8_enabled` has the policy and
its measurements); fp32 activations (and ``LOCALCHAT_CPU_A8=0``) run the exact fp32-activation
kernels. ``LOCALCHAT_KERNELS=reference`` forces the references everywhere (feature-off baselines,
debugging) and never builds the C++ kernels; ``LOCALCHAT_KERNELS=triton`` sends CPU tensors
through the Triton launchers too (under ``TRITON_INTERPRET=1``, for tests). The Triton modules
are imported lazily so that
CPU-only installs never import Triton, and so that tests can import them under
``TRITON_INTERPRET=1`` themselves.

Ops: ``store_kv_cache``, ``paged_attention_decode``, ``prefill_attention``, ``rms_norm``,
``fused_add_rms_norm``, ``apply_rope``, ``silu_and_mul``, ``int8_matmul``, ``int4_matmul``
(the last two dispatched in ``quant_dispatch.py``); shapes and contracts in each reference's docstring (the Triton versions keep them). CPU float
layers call ``cpu.float_matmul`` / ``float_matmul_t`` for up to ``CPU_MAX_ROWS`` rows
themselves (``engine/quant/methods.py``; reference ``reference.linear``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os

import torch

from . import reference, reference_a8

__all__ = [
    "INPUT", "apply_rope", "cpu_int4_call", "cpu_int8_call", "fused_add_rms_norm",
    "int4_a8_layout_ok", "int4_matmul", "int8_matmul", "kv_readable", "paged_attention_decode",
    "prefill_attention", "rms_norm", "silu_and_mul", "store_kv_cache", "triton_available",
]


@functools.cache
def triton_available() -> bool:
    """True when Triton imports and ``LOCALCHAT_KERNELS`` does not force the references."""
    if os.environ.get("LOCALCHAT_KERNELS", "").lower() == "reference":
        return False
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


@functools.cache
def _kernels_env() -> str:
    return os.environ.get("LOCALCHAT_KERNELS", "").strip().lower()


def refresh_env() -> None:
    """Re-read the environment switches. ``LOCALCHAT_KERNELS=triton`` routing,
    ``LOCALCHAT_CPU_A8`` and ``LOCALCHAT_CPU_ISA`` are read once per process (every op call
    consults them); call this after changing one at run time (tests' ``monkeypatch`` does, see
    ``tests/conftest.py``). ``LOCALCHAT_KERNELS=reference`` is fixed once the kernels load."""
    from . import cpu

    _kernels_env.cache_clear()
    _a8_mode.cache_clear()
    cpu_stack_enabled.cache_clear()
    cpu.active_isa.cache_clear()
    cpu.amx_decode_enabled.cache_clear()


def _use_triton(t: torch.Tensor) -> bool:
    # LOCALCHAT_KERNELS=triton also sends CPU tensors through the Triton launchers (with
    # TRITON_INTERPRET=1: the model-level interpreter tests and the CPU capture check).
    return (t.is_cuda or _kernels_env() == "triton") and triton_available()


# Rows up to which the CPU quantized matmuls beat dequantize + GEMM (decode, verification).
CPU_MAX_ROWS = 16
# "0" keeps CPU decode / verification steps on the Python layers instead of the C++ decoder
# stack (cpu_stack_enabled).
STACK_ENV = "LOCALCHAT_CPU_STACK"


@functools.cache
def cpu_stack_enabled() -> bool:
    """Whether CPU forwards of at most ``CPU_MAX_ROWS`` rows may run the whole decoder stack
    in one C++ call (``kernels/cpu/stack_ops.cpp``, ``engine/models/cpu_stack.py``): the same
    ops with the same arguments as the Python layers, so the same bits, minus the host's
    per-layer work. On unless ``LOCALCHAT_CPU_STACK=0`` (an A/B switch, read once:
    :func:`refresh_env`)."""
    return os.environ.get(STACK_ENV, "").strip().lower() not in ("0", "false", "no", "off")
# CPU quantized matmuls on the integer-dot (W4A8/W8A8) kernels: "1" always, "0" never, unset
# for 16-bit activations (cpu_a8_enabled).
A8_ENV = "LOCALCHAT_CPU_A8"


_cpu_module = None  # localchat.kernels.cpu once first needed (an import per op call costs)


def _cpu():
    """``localchat.kernels.cpu`` when its C++ kernels are built (built on the first call),
    else None. ``cpu.available`` is consulted on every call (tests replace it)."""
    global _cpu_module
    if _cpu_module is None:
        from . import cpu

        _cpu_module = cpu
    return _cpu_module if _cpu_module.available() else None


def _use_cpu(x: torch.Tensor) -> bool:
    if not x.is_cpu or x.dim() != 2 or x.shape[0] > CPU_MAX_ROWS:
        return False
    return _cpu() is not None


_CPU_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _cpu_ok(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a CPU tensor of one float dtype and the C++ kernels are
    built (the elementwise / attention ops; the matmuls check their own layouts). Runs on
    every op call: plain attribute checks (``is_cpu``, not ``device.type``), no generator."""
    t0 = tensors[0]
    dtype = t0.dtype
    if not t0.is_cpu or dtype not in _CPU_FLOATS:
        return False
    for t in tensors[1:]:
        if not t.is_cpu or t.dtype != dtype:
            return False
    return _cpu() is not None


@functools.cache
def _triton(module: str):
    return importlib.import_module(f".{module}", __name__)


def store_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """See ``reference.store_kv_cache``."""
    if _use_triton(key):
        return _triton("triton_kv").store_kv_cache(key, value, key_cache, value_cache,
                                                   slot_mapping)
    if _cpu_ok(key, value) and _cpu_ok(key_cache, value_cache) and key_cache.is_contiguous() \
            and value_cache.is_contiguous() and key.dim() == 3:
        cpu = _cpu_module
        return cpu.store_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    return reference.store_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def kv_readable(dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether the CPU KV store and paged attention take a ``kv_dtype`` cache under ``dtype``
    queries: the same type, or fp16 / bf16 under fp32 (an fp32 engine's default fp16 cache)."""
    return kv_dtype == dtype or (dtype == torch.float32 and kv_dtype in _CPU_FLOATS[1:])


def _paged_cpu_ok(query, key_cache, value_cache) -> bool:
    """The shapes the C++ paged attention takes: ``head_dim`` a multiple of 16 up to 256, at
    most 16 query heads per kv head, CPU tensors whose dtypes :func:`kv_readable` admits."""
    return _cpu_ok(key_cache, value_cache) and _cpu_ok(query) and query.dim() == 3 \
        and kv_readable(query.dtype, key_cache.dtype) and key_cache.dim() == 4 \
        and query.shape[-1] % 16 == 0 and query.shape[-1] <= 256 \
        and query.shape[1] % key_cache.shape[2] == 0 and query.shape[1] // key_cache.shape[2] <= 16


# Query tokens per sequence up to which CPU prefill_attention calls (speculative verification,
# short chunks) run as decode rows (``cpu.paged_attention_verify``); longer chunks run SDPA.
CPU_VERIFY_MAX_QUERY = 16


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale,
                           max_seq_len: int | None = None):
    """See ``reference.paged_attention_decode`` (split-K chosen by the Triton launcher from
    ``max_seq_len``, a host-side bound of ``seq_lens`` in tokens; the reference ignores it)."""
    if _use_triton(query):
        return _triton("triton_decode").paged_attention_decode(
            query, key_cache, value_cache, block_tables, seq_lens, scale,
            max_seq_len=max_seq_len)
    if _paged_cpu_ok(query, key_cache, value_cache):
        cpu = _cpu_module
        return cpu.paged_attention_decode(query, key_cache, value_cache, block_tables,
                                          seq_lens, scale)
    return reference.paged_attention_decode(query, key_cache, value_cache, block_tables,
                                            seq_lens, scale)


def prefill_attention(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                      scale, max_query_len: int | None = None):
    """See ``reference.prefill_attention``. ``max_query_len`` (tokens, optional) spares the
    Triton launcher a device-to-host read; the reference ignores it. On CPU, chunks of at
    most ``CPU_VERIFY_MAX_QUERY`` tokens (``max_query_len`` given) run the C++ decode tasks
    per query row (``cpu.paged_attention_verify``): each row equals the decode step at its
    position bit for bit, so verifying drafts computes what plain decoding would."""
    if _use_triton(query):
        return _triton("triton_prefill").prefill_attention(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale,
            max_query_len=max_query_len)
    if max_query_len is not None and max_query_len <= CPU_VERIFY_MAX_QUERY \
            and _paged_cpu_ok(query, key_cache, value_cache):
        cpu = _cpu_module
        return cpu.paged_attention_verify(query, key_cache, value_cache, query_start_loc,
                                          seq_lens, block_tables, scale)
    return reference.prefill_attention(query, key_cache, value_cache, query_start_loc,
                                       seq_lens, block_tables, scale)


def rms_norm(x, weight, eps):
    """See ``reference.rms_norm``."""
    if _use_triton(x):
        return _triton("triton_norm").rms_norm(x, weight, eps)
    if _cpu_ok(x, weight) and weight.dim() == 1:
        cpu = _cpu_module
        return cpu.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(x, residual, weight, eps):
    """See ``reference.fused_add_rms_norm``; the Triton version updates ``x`` and
    ``residual`` in place (callers must not reuse them)."""
    if _use_triton(x):
        return _triton("triton_norm").fused_add_rms_norm(x, residual, weight, eps)
    if _cpu_ok(x, residual, weight) and weight.dim() == 1 and x.shape == residual.shape:
        cpu = _cpu_module
        return cpu.fused_add_rms_norm(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def apply_rope(positions, query, key, cos_sin_cache):
    """See ``reference.apply_rope``."""
    if _use_triton(query):
        return _triton("triton_rope").apply_rope(positions, query, key, cos_sin_cache)
    if _cpu_ok(query, key) and cos_sin_cache.dtype == torch.float32 and query.dim() == 3:
        cpu = _cpu_module
        return cpu.apply_rope(positions, query, key, cos_sin_cache)
    return reference.apply_rope(positions, query, key, cos_sin_cache)


@functools.cache
def _a8_mode() -> str:
    value = os.environ.get(A8_ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "never"
    if value in ("1", "true", "yes", "on"):
        return "always"
    return "auto"


def cpu_a8_enabled(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether CPU quantized matmuls (``M <= CPU_MAX_ROWS``) with activations of ``dtype``
    take the integer-dot W4A8 / W8A8 kernels (activations rounded to int8 per 32-column block,
    llama.cpp's Q8_0 activation blocks). By default for 16-bit activations (bf16 / fp16, the
    CPU decode dtype), whose own rounding already dominates: SmolLM2-135M native, decoded in
    chunks of 16 tokens, agreed on the top-1 token with the fp32 dequantized-GGUF oracle at
    95.3% of 256 positions with bf16 activations through the exact kernels and 93.8% through
    the integer-dot ones; fp32 activations keep the exact kernels (100%; the integer-dot
    kernels 94.5%), so an fp32 engine stays the precise one. ``LOCALCHAT_CPU_A8=1`` takes
    them for fp32 too, ``=0`` never. Single-thread CPU time (``time.thread_time`` per call,
    AVX-512 VNNI, one bf16 row, one run): the integer-dot int4 kernel took 0.38-0.66x PyTorch's
    int4pack kernel's time. The switch is read once (:func:`refresh_env`)."""
    mode = _a8_mode()
    return mode == "always" or (mode == "auto" and (dtype != torch.float32 or _a8_fp32))


_a8_fp32 = False  # inside a8_fp32(): fp32 activations take the integer-dot kernels too
_inexact_prompts = False  # inside inexact_prompts(): short prefills keep the integer-dot kernels


# The most fp32 rows a CPU forward (a short prompt's prefill) runs as chunks of CPU_MAX_ROWS
# rows on the exact C++ matmuls (short_prefill_chunks).
SHORT_PREFILL_MAX_ROWS = 64


def short_prefill_chunks(x: torch.Tensor) -> bool:
    """Whether a quantized linear of fp32 rows ``x [M, K]`` runs as chunks of ``CPU_MAX_ROWS``
    rows through the exact fp32-activation C++ kernels instead of its prefill GEMM (CPU,
    ``CPU_MAX_ROWS < M <= SHORT_PREFILL_MAX_ROWS``, the kernels built; the layer must take
    them: ``LinearMethod.exact_cpu_rows``). The prefill GEMM first dequantizes every weight to
    fp32, 4 bytes written and read back per weight whatever M; the row kernels read the
    quantized bytes once per 16 rows and dequantize them in registers. Both multiply exact fp32
    weights by fp32 activations with fp32 accumulation (in another order), and each row of a
    chunk equals the one-row call (batch invariant). Measured on a 2-core AVX2 EPYC, 2 threads,
    Qwen2.5-Coder-1.5B's Q4_K 17920 x 1536 gate/up weight: 18 / 29 / 38 / 55 ms at 17 / 32 /
    48 / 64 rows against 35 / 43 / 47 / 74 ms for the dequantized GEMM; 80 against 66 at 96
    rows, where the GEMM wins. The AVX2 int4 kernel's many-row path (``int4_many``, each
    weight dequantized once per chunk) later made the 16-row call about 1.4x faster, and the
    whole prefill still crossed over between 80 and 96 rows (1.5B: 2.9 s chunked / 3.2 s GEMM
    at 80 rows, 3.9 / 3.3 at 96; SmolLM2 already prefers the GEMM at 80), so the bound stays."""
    return (x.is_cpu and x.dim() == 2 and x.dtype == torch.float32
            and CPU_MAX_ROWS < x.shape[0] <= SHORT_PREFILL_MAX_ROWS and _cpu() is not None)


@contextlib.contextmanager
def a8_fp32(enabled: bool = True):
    """Within this context (one thread: the engine's), CPU quantized matmuls given fp32
    activations take the integer-dot kernels wherever they would for 16-bit ones
    (:func:`cpu_a8_enabled` in ``auto`` mode); with ``enabled=False`` they keep the exact
    kernels, also inside an enclosing ``a8_fp32()``. For the output layer of a bf16 model: the
    kernels round activations to int8 either way, so the exactly widened fp32 input gives the
    same integer products as the bf16 one, and the logits come out of the kernel in fp32
    instead of rounded to bf16 (8 mantissa bits: logits near 20 in steps of 0.125, so
    near-ties in greedy decoding collapsed and went to the lower token id) and widened again."""
    global _a8_fp32
    old, _a8_fp32 = _a8_fp32, enabled
    try:
        yield
    finally:
        _a8_fp32 = old


@contextlib.contextmanager
def inexact_prompts():
    """Within this context (one thread: the engine's), a short fp32 prefill's 16-row chunks
    (:func:`short_prefill_chunks`) keep the enclosing :func:`a8_fp32` setting instead of
    switching to the exact kernels. For a draft model (``spec_decode.proposer``): its logits
    only pick proposals that the target verifies, so exact prompts buy it nothing, and the
    catch-up after a probe of the adaptive draft length (19 tokens of the Qwen2.5-Coder-0.5B
    draft) spent 142 of its 210 ms in the exact fp32 int5 kernel; through the integer-dot one
    it took 144 ms (2-core AVX2 EPYC, 2 threads)."""
    global _inexact_prompts
    old, _inexact_prompts = _inexact_prompts, True
    try:
        yield
    finally:
        _inexact_prompts = old


def exact_prompts() -> bool:
    """Whether short fp32 prefills run on the exact kernels (outside :func:`inexact_prompts`)."""
    return not _inexact_prompts


def a8_rounded(x: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` fp32 (K a multiple of 32) as the integer-dot kernels see it: ``q * d``
    per 32-column block (``reference_a8.quantize_activations_int8``), fp32 ``[M, K]``; ``x``
    minus it is the rounding, at most ``d / 2`` per element."""
    m, k = x.shape
    q, d = reference_a8.quantize_activations_int8(x)
    return (q.float().view(m, -1, reference_a8.A8_BLOCK) * d[..., None]).view(m, k)


def a8_two_pass(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for a quantized linear ``fn`` (``x [T, K]`` fp32 -> ``[T, N]`` fp32) through
    the integer-dot kernels at almost fp32 precision: each row is split into its int8 rounding
    ``hi = q * d`` (``reference_a8.quantize_activations_int8``, the integers the kernels form)
    and the remainder ``lo = x - hi``, both go through one ``fn`` call of twice the rows and the
    two results are summed. ``hi`` re-quantizes to the same integers and ``lo`` (at most
    ``d / 2`` per element) rounds to int8 with a 254x smaller step, so the activation error
    falls from ``d / 2`` to about ``d / 508``: logits within ~0.005 of the exact kernel's where
    one pass moves them by 0.1-1.0 (``tests/kernels/test_a8_two_pass.py``), for the price of a
    2-row call (the weights are read once; about 1.4x a 1-row call) rather than the exact
    kernel's ~2.5x. Where ``fn`` takes the exact kernels instead the sum is
    ``fn(hi) + fn(lo) = fn(x)`` up to fp32 rounding, so the result is right either way. Rows go 8 at a time (16-row calls, ``CPU_MAX_ROWS``), and each row's
    result depends on that row alone (batch invariant). ``K % 32 != 0``: ``fn(x)``."""
    t, k = x.shape
    if k % reference_a8.A8_BLOCK:
        return fn(x)
    step = CPU_MAX_ROWS // 2
    out = []
    for i in range(0, t, step):
        xc = x[i:i + step].float()
        hi = a8_rounded(xc)
        y = fn(torch.cat([hi, xc - hi]))
        out.append(y[:len(xc)] + y[len(xc):])
    return out[0] if len(out) == 1 else torch.cat(out)


def silu_and_mul(x):
    """See ``reference.silu_and_mul`` (``x [num_tokens, 2 * I]`` gate | up -> ``[num_tokens,
    I]``). CPU fp32/bf16/fp16 calls run the C++ kernel (vectorized exp; 1.3-1.5x faster than
    the reference's two ATen ops at decode shapes, ``bench_kernels.py``)."""
    if _use_triton(x):
        return reference.silu_and_mul(x)
    if _cpu_ok(x) and x.dim() == 2 and x.shape[-1] % 2 == 0:
        cpu = _cpu_module
        return cpu.silu_and_mul(x)
    return reference.silu_and_mul(x)


# The quantized matmuls' dispatch lives in its own module; imported last, since it reads the
# dispatch helpers above.
from .quant_dispatch import (
    INPUT,
    cpu_int4_call,
    cpu_int8_call,
    int4_a8_layout_ok,
    int4_matmul,
    int8_matmul,
)
