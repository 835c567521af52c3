"""Exact repacking of GGUF tensor blocks onto the engine's weight layouts.

Every supported GGML type maps with no loss onto one of three layouts (the shared contract of
``engine/quant/int4.py``, ``int8.py`` and ``localchat.kernels``):

* ``int4``: ``qweight`` uint8 ``[N, K // 2]`` (low nibble = even k), ``scales``/``mins``
  ``[N, K // 32]``; ``w = q * scale + min``, q in 0..15. Q4_0 (``min = -8 d``), Q4_1
  (``scale d, min m``), Q4_K (``scale d * sc, min -dmin * m``) held in two levels as in its
  file (:data:`TWO_LEVEL_TYPES`): ``scales`` / ``mins`` uint8 (the 6-bit ``sc`` and ``m``)
  and ``super_scales`` fp16 ``[N, K // 256, 2]`` (``d, -dmin``), 18.5 bytes per 32 weights
  against the file's 18 (``localchat.kernels.reference.fold_kscales`` folds them into the
  fp32 ``d * sc``, ``-dmin * m``, exactly; the C++ kernels read them in place).
* ``int8``: ``qweight`` int8 ``[N, K]``, ``scales`` fp32 ``[N, K // G]``, ``mins`` fp32 or
  ``None``; ``w = q * scale (+ min)``. Q8_0 (G 32), Q5_0 (q - 16, G 32), Q5_1 (G 32, mins),
  Q5_K (G 32, mins), Q6_K (q - 32, G 16), Q3_K (G 16), Q2_K (G 16, mins), IQ4_NL (the
  non-linear 16-entry table's int8 values, G 32).
* ``float``: F32, F16, BF16 kept in their own dtype.

Scales and mins are stored as fp16 for the types whose per-block floats are fp16 values in the
file (:data:`FP16_SCALE_TYPES`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; Q4_0's ``-8 d`` is an
fp16 times a power of two), so Q8_0 holds 34 bytes per 32 weights as in the file, not 36. The
other K-quants' products ``d * sc`` have up to 17-18 significant bits and stay fp32: on the
Qwen2.5 bundles no Q4_K or Q6_K tensor has all its products exact in fp16 (5-36% of them
are), so the rule is by type and known from the tensor table before any tensor is read.

Each product ``q * scale`` is exact in fp32 (an fp16 ``d`` has 11 significant bits, a 6-bit
sub-scale and a <= 6-bit q add at most 12) and the only rounding is the final ``+ min``, the
same single rounding ``gguf.quants.dequantize`` performs, so :func:`dequantize_repacked` equals
gguf's numpy dequantization bit for bit. Block formats: ggml's ``ggml-common.h`` /
``ggml-quants.c`` and the ``gguf`` package's ``quants.py`` (read, not copied).

Two implementations: the C++ op ``localchat.kernels.cpu.gguf_repack`` (``kernels/cpu/
repack_ops.cpp``, every quantized type here, threads over rows; :func:`repack_gguf_into`
writes straight into given tensors, e.g. a layer's rows) where the CPU kernels are built, and
the numpy path (:func:`gguf_blocks.decode_blocks`, :func:`_repack_numpy`) otherwise (no compiler,
``LOCALCHAT_KERNELS=reference``): the reference the C++ op equals bit for bit
(``tests/kernels/test_cpu_gguf_repack.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ModelLoadError
from .gguf_blocks import QK_K, decode_blocks, q4_k_two_level

# GGML type number -> (name, weights per block, bytes per block, layout)
GGML_TYPES: dict[int, tuple[str, int, int, str]] = {
    0: ("F32", 1, 4, "float"),
    1: ("F16", 1, 2, "float"),
    2: ("Q4_0", 32, 18, "int4"),
    3: ("Q4_1", 32, 20, "int4"),
    6: ("Q5_0", 32, 22, "int8"),
    7: ("Q5_1", 32, 24, "int8"),
    8: ("Q8_0", 32, 34, "int8"),
    10: ("Q2_K", QK_K, 84, "int8"),
    11: ("Q3_K", QK_K, 110, "int8"),
    12: ("Q4_K", QK_K, 144, "int4"),
    13: ("Q5_K", QK_K, 176, "int8"),
    14: ("Q6_K", QK_K, 210, "int8"),
    20: ("IQ4_NL", 32, 18, "int8"),
    30: ("BF16", 1, 2, "float"),
}

# types whose scales (and mins) are fp16 values: stored as fp16, exactly
FP16_SCALE_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"})
# types held with two-level scales (uint8 sub-block scales / mins + fp16 super_scales)
TWO_LEVEL_TYPES = frozenset({"Q4_K"})

@dataclass
class RepackedWeight:
    """One GGUF tensor on an engine layout (see the module docstring).

    ``layout`` "int4" | "int8" | "float"; ``qweight`` (int4: uint8 ``[N, K // 2]``; int8: int8
    ``[N, K]``; float: the tensor ``[N, K]`` or ``[K]`` in its GGUF dtype); ``scales`` and
    ``mins`` ``[N, K // group_size]``, fp16 for :data:`FP16_SCALE_TYPES`, uint8 for
    :data:`TWO_LEVEL_TYPES` (then ``super_scales`` fp16 ``[N, K // 256, 2]``), fp32 otherwise
    (``mins`` ``None`` for symmetric int8 types; both ``None`` for float); ``group_size``
    weights per scale (0 for float); ``ggml_type`` the source type's name.
    """

    layout: str
    qweight: torch.Tensor
    scales: torch.Tensor | None
    mins: torch.Tensor | None
    group_size: int
    ggml_type: str
    super_scales: torch.Tensor | None = None

    def folded(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(scales, mins)`` with two-level scales folded into fp32 (exact); as held
        otherwise."""
        if self.super_scales is None:
            return self.scales, self.mins
        from localchat.kernels.reference import fold_kscales

        return fold_kscales(self.scales, self.mins, self.super_scales)

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical weight shape (``[N, K]`` or ``[K]``)."""
        if self.layout == "int4":
            return (self.qweight.shape[0], self.qweight.shape[1] * 2)
        return tuple(self.qweight.shape)

    def nbytes(self) -> int:
        """Bytes held by this weight's tensors."""
        return sum(t.numel() * t.element_size()
                   for t in (self.qweight, self.scales, self.mins, self.super_scales)
                   if t is not None)


def scale_dtype(ggml_type: int) -> torch.dtype | None:
    """The dtype of the scales/mins GGML type ``ggml_type`` repacks onto: fp16 for
    :data:`FP16_SCALE_TYPES`, uint8 for :data:`TWO_LEVEL_TYPES` (with fp16 ``super_scales``),
    fp32 for the other quantized types, ``None`` for float types."""
    name, _, _, layout = GGML_TYPES[ggml_type]
    if layout == "float":
        return None
    if name in TWO_LEVEL_TYPES:
        return torch.uint8
    return torch.float16 if name in FP16_SCALE_TYPES else torch.float32


def ggml_type_name(ggml_type: int) -> str:
    """Name of GGML type number ``ggml_type`` (``"type 99"`` when unknown to us and gguf)."""
    if ggml_type in GGML_TYPES:
        return GGML_TYPES[ggml_type][0]
    try:
        import gguf

        return gguf.GGMLQuantizationType(ggml_type).name
    except (ImportError, ValueError):
        return f"type {ggml_type}"


def ggml_layout(ggml_type: int, tensor_name: str = "?") -> str:
    """The engine layout ("int4" | "int8" | "float") GGML type ``ggml_type`` repacks onto.

    Raises ``ModelLoadError`` naming the tensor and type when the type is not supported.
    """
    if ggml_type not in GGML_TYPES:
        raise ModelLoadError(
            f"tensor {tensor_name} uses GGUF type {ggml_type_name(ggml_type)}, which localchat "
            f"cannot load (supported: {', '.join(v[0] for v in GGML_TYPES.values())})"
        )
    return GGML_TYPES[ggml_type][3]


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes a GGUF tensor of ``shape`` (HF order, last dim contiguous) takes in the file."""
    _, block, type_size, _ = GGML_TYPES[ggml_type]
    n = int(np.prod(shape))
    return n // block * type_size


_FLOAT_DTYPES = {"F32": (np.float32, torch.float32), "F16": (np.float16, torch.float16),
                 "BF16": (np.int16, torch.bfloat16)}


def _checked_bytes(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...],
                   tensor_name: str) -> np.ndarray:
    """``raw`` as contiguous 1-D uint8 after the type and byte-count checks (the layout must
    be supported, a quantized tensor 2-D); raises ``ModelLoadError`` otherwise."""
    layout = ggml_layout(ggml_type, tensor_name)
    name, block, _, _ = GGML_TYPES[ggml_type]
    expected = tensor_nbytes(ggml_type, shape) if int(np.prod(shape)) % block == 0 else -1
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if raw.size != expected or (layout != "float" and len(shape) != 2):
        raise ModelLoadError(
            f"tensor {tensor_name} ({name}, shape {list(shape)}) has {raw.size} bytes, "
            f"expected {expected}: the GGUF file is corrupt"
        )
    return raw


def _cpu_repack():
    """``localchat.kernels.cpu`` when its C++ kernels are built (never under
    ``LOCALCHAT_KERNELS=reference``), else None: then the numpy path repacks."""
    from localchat.kernels import cpu

    return cpu if cpu.available() else None


def _raw_tensor(raw: np.ndarray) -> torch.Tensor:
    """A uint8 tensor sharing ``raw``'s memory (a read-only memory map is never written)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not writable": the op only reads it
        return torch.from_numpy(raw)


def repack_gguf_into(raw: np.ndarray, ggml_type: int, shape: tuple[int, int],
                     qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                     rows: torch.Tensor | None = None, tensor_name: str = "?",
                     super_scales: torch.Tensor | None = None) -> bool:
    """Repack one quantized GGUF tensor straight into allocated outputs with the C++ op
    (``localchat.kernels.cpu.gguf_repack``), e.g. a layer's rows: no intermediate copy.

    ``raw``, ``shape`` (``[N, K]``) as :func:`repack_gguf_tensor`; ``qweight`` / ``scales`` /
    ``mins`` (and ``super_scales`` for :data:`TWO_LEVEL_TYPES`) contiguous, shaped and typed
    as :func:`repack_gguf_tensor` returns them (``[N', ...]``); ``rows`` (int64 ``[N']``, optional) the source row of each output row
    (:func:`unpermute_source_rows`). Returns False, writing nothing, where the C++ kernels
    are not built or the type is not one they take (the caller then repacks with
    :func:`repack_gguf_tensor` and copies). Raises ``ModelLoadError`` like
    :func:`repack_gguf_tensor` (wrong byte count, unsupported type, fp16 scale overflow).
    """
    raw = _checked_bytes(raw, ggml_type, shape, tensor_name)
    cpu = _cpu_repack()
    if cpu is None or ggml_type not in cpu.GGUF_REPACK_TYPES \
            or shape[1] % GGML_TYPES[ggml_type][1] != 0:
        return False
    if cpu.gguf_repack(_raw_tensor(raw), ggml_type, qweight, scales, mins, rows,
                       super_scales):
        raise ModelLoadError(f"tensor {tensor_name}: block scales out of the fp16 range: "
                             "the GGUF file is corrupt")
    return True


def repack_gguf_tensor(
    raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], tensor_name: str = "?"
) -> RepackedWeight:
    """Repack one GGUF tensor's bytes onto its engine layout, exactly.

    ``raw``: the tensor's bytes (any numpy view of them, e.g. a memory-map slice);
    ``shape``: HF order (``[N, K]`` for a matrix, GGUF's dims reversed; ``[K]`` for vectors,
    float types only). Returns a :class:`RepackedWeight` owning its memory. Quantized types
    run the C++ op where the CPU kernels are built (:func:`repack_gguf_into`, 10-30x faster),
    else the numpy path (:func:`gguf_blocks.decode_blocks`, the reference: the two agree bit for bit). Raises
    ``ModelLoadError`` for an unsupported type or a byte count that does not match.
    """
    raw = _checked_bytes(raw, ggml_type, shape, tensor_name)
    name, _, _, layout = GGML_TYPES[ggml_type]
    if layout == "float":
        np_dtype, dtype = _FLOAT_DTYPES[name]
        t = torch.from_numpy(raw.view(np_dtype).reshape(shape).copy())
        return RepackedWeight("float", t.view(dtype), None, None, 0, name)
    n, k = shape
    group, has_mins = repacked_group(ggml_type)
    sdtype = scale_dtype(ggml_type)
    if layout == "int4":
        qweight = torch.empty(n, k // 2, dtype=torch.uint8)
    else:
        qweight = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, k // group, dtype=sdtype)
    mins_t = torch.empty(n, k // group, dtype=sdtype) if has_mins else None
    sup = torch.empty(n, k // QK_K, 2, dtype=torch.float16) if name in TWO_LEVEL_TYPES \
        else None
    if repack_gguf_into(raw, ggml_type, shape, qweight, scales, mins_t, None, tensor_name,
                        sup):
        return RepackedWeight(layout, qweight, scales, mins_t, group, name, sup)
    return _repack_numpy(raw, ggml_type, shape, tensor_name)


def repacked_group(ggml_type: int) -> tuple[int, bool]:
    """``(group_size, has_mins)`` of quantized GGML type ``ggml_type``'s engine layout."""
    name = GGML_TYPES[ggml_type][0]
    return (16 if name in ("Q6_K", "Q3_K", "Q2_K") else 32,
            name in ("Q4_0", "Q4_1", "Q4_K", "Q5_1", "Q5_K", "Q2_K"))


def _repack_numpy(raw: np.ndarray, ggml_type: int, shape: tuple[int, int],
                  tensor_name: str = "?") -> RepackedWeight:
    """The numpy path of :func:`repack_gguf_tensor` for a quantized type (checked ``raw``):
    the reference the C++ op is tested against."""
    name, block, type_size, layout = GGML_TYPES[ggml_type]
    n, k = shape
    if name in TWO_LEVEL_TYPES:
        q, sc, mn, sup = q4_k_two_level(raw.reshape(-1, type_size))
        q = q.reshape(n, k)
        packed = np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))
        return RepackedWeight("int4", torch.from_numpy(packed),
                              torch.from_numpy(np.ascontiguousarray(sc.reshape(n, k // 32))),
                              torch.from_numpy(np.ascontiguousarray(mn.reshape(n, k // 32))),
                              32, name,
                              torch.from_numpy(np.ascontiguousarray(sup.reshape(n, k // QK_K,
                                                                                2))))
    q, scale, mins = decode_blocks(name, raw.reshape(-1, type_size))
    groups = scale.shape[1]
    group = block // groups
    np_scale = np.float16 if name in FP16_SCALE_TYPES else np.float32
    scales = _scale_tensor(scale.reshape(n, k // group), np_scale, tensor_name)
    mins_t = None if mins is None else _scale_tensor(mins.reshape(n, k // group), np_scale,
                                                     tensor_name)
    if layout == "int4":
        q = q.reshape(n, k).astype(np.uint8)
        packed = q[:, 0::2] | (q[:, 1::2] << 4)
        return RepackedWeight("int4", torch.from_numpy(np.ascontiguousarray(packed)), scales,
                              mins_t, group, name)
    qweight = torch.from_numpy(np.ascontiguousarray(q.reshape(n, k).astype(np.int8)))
    return RepackedWeight("int8", qweight, scales, mins_t, group, name)


def _scale_tensor(values: np.ndarray, np_dtype, tensor_name: str) -> torch.Tensor:
    """fp32 ``values`` -> a tensor of ``np_dtype``; raises ``ModelLoadError`` when an fp16
    store would not give back the same fp32 values (Q4_0 with ``|d| > 8188``: never in a
    real model, but never silently rounded)."""
    with np.errstate(over="ignore"):  # an overflow is the error raised below
        out = np.ascontiguousarray(values, np_dtype)
    if np_dtype is not np.float32 and not np.array_equal(out.astype(np.float32), values,
                                                              equal_nan=True):
        raise ModelLoadError(f"tensor {tensor_name}: block scales out of the fp16 range: "
                             "the GGUF file is corrupt")
    return torch.from_numpy(out)


def dequantize_repacked(w: RepackedWeight) -> torch.Tensor:
    """The engine's fp32 dequantization of a repacked weight: ``[N, K]`` (or ``[K]``).

    int4: ``q * scale + min``; int8: ``q * scale`` (``+ min``); float: a cast. Equal bit for
    bit to ``gguf.quants.dequantize`` on the source bytes (see the module docstring).
    """
    from .int4 import dequantize_int4
    from .int8 import dequantize_int8_grouped

    if w.layout == "float":
        return w.qweight.float()
    if w.layout == "int4":
        return dequantize_int4(w.qweight, *w.folded())
    return dequantize_int8_grouped(w.qweight, w.scales, w.mins)


def unpermute_source_rows(n: int, n_head: int) -> torch.Tensor:
    """int64 ``[n]``: the source row of each output row under :func:`unpermute_rows`
    (llama.cpp's Q/K permutation inverted), for :func:`repack_gguf_into`'s ``rows``."""
    return torch.arange(n).reshape(n_head, n // n_head // 2, 2).transpose(1, 2).reshape(-1)


def unpermute_rows(w: RepackedWeight, n_head: int) -> RepackedWeight:
    """Invert llama.cpp's Q/K row permutation (interleaved -> half-split RoPE) on every tensor
    of ``w`` (rows are output channels, so the quantized rows move as they are)."""

    def fix(t):
        if t is None:
            return None
        dim = t.shape[0] // n_head // 2
        return t.reshape(n_head, dim, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape) \
            .contiguous()

    return RepackedWeight(w.layout, fix(w.qweight), fix(w.scales), fix(w.mins), w.group_size,
                          w.ggml_type, fix(w.super_scales))
