"""The ``native`` weight format: a GGUF's own quantization, repacked exactly, computed as is.

Each linear layer (and the embedding / LM head) keeps the layout its GGUF type repacks onto
(``gguf_repack.py``): int4 groups of 32 with a scale and a min (Q4_0 / Q4_1 / Q4_K, the last
with its two-level scales), int6 for Q6_K and int5 for Q5_0 where the CPU kernels read them
(``native_int6.py``, ``native_int5.py``), group-wise int8 (Q8_0, Q5_1, Q5_K, Q5_0 / Q6_K
elsewhere, ...), or the float dtype. A fused layer whose shards repack onto
different layouts (``qkv_proj`` with Q4_K ``q``, ``k`` and a Q6_K ``v``) keeps each shard in
its own layout and multiplies shard by shard (``sharded.py``); shards that agree share one
layout and one matmul. Reference design: llama.cpp keeps each tensor in its file type and
dispatches per type; vLLM's GGUF linear method does the same per layer.

Compute paths: int4 reuses ``Int4LinearMethod`` (on CPU localchat's exact C++ kernels over
this layout, ``cpu_int4.py``; without them PyTorch's ``_weight_int4pack_mm_for_cpu``, bf16
scales); group-wise int8 uses
``localchat.kernels.int8_matmul`` on CUDA and, for up to ``CPU_MAX_ROWS`` rows, on CPU
through the C++ kernel; more rows on CPU (prefill) dequantize blocks of weight rows with the
C++ ``int8_dequantize`` into the scratch every layer shares and multiply them with
``torch.mm``, in bf16 for bf16 activations, else fp32 (``cpu_prefill.py``); without the C++
kernels the blocks are dequantized with PyTorch ops and multiplied in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .int4 import dequantize_int4, int4_weight_bytes, kscale_weight_bytes
from .int4_method import Int4LinearMethod
from .int8 import dequantize_int8_grouped, int8_grouped_weight_bytes
from .methods import LinearMethod, _add_bias, _flat, _kernel, _set_buffer
from .schemes import QuantScheme


def _cpu_kernel_rows() -> int:
    """Rows up to which CPU calls go to ``localchat.kernels``' C++ group-wise int8 kernel
    (0 when it is not built: no compiler, or ``LOCALCHAT_KERNELS=reference``)."""
    from localchat import kernels
    from localchat.kernels import cpu

    return kernels.CPU_MAX_ROWS if cpu.available() else 0


class Int8GroupLinearMethod(LinearMethod):
    """Group-wise int8 (``w = q * scale (+ min)``, ``qweight`` int8 ``[N, K]``, ``scales`` /
    ``mins`` ``[N, K // group_size]`` in ``scale_dtype``: fp16 when every shard's GGUF type
    has fp16 block scales, else fp32); ``apply(layer, x [..., K]) -> [..., N]`` in x's dtype
    with fp32 accumulation."""

    scheme = QuantScheme.NATIVE

    def __init__(self, device: torch.device, group_size: int, has_mins: bool,
                 kernel: str = "packed", scale_dtype: torch.dtype = torch.float32) -> None:
        self.device = torch.device(device)
        self.group_size = group_size
        self.has_mins = has_mins
        self.kernel = kernel
        self.scale_dtype = scale_dtype

    def create_weights(self, layer, device):
        n, k, g = layer.out_features, layer.in_features, self.group_size
        layer.weight = None
        _set_buffer(layer, "qweight", torch.empty(n, k, dtype=torch.int8, device=device))
        _set_buffer(layer, "scales", torch.empty(n, k // g, dtype=self.scale_dtype,
                                                 device=device))
        if self.has_mins:
            _set_buffer(layer, "mins", torch.empty(n, k // g, dtype=self.scale_dtype,
                                                   device=device))

    def process_weights_after_loading(self, layer):
        pass

    def _mins(self, layer):
        return layer.mins if self.has_mins else None

    def exact_cpu_rows(self, layer):
        return self.kernel == "packed" and layer.qweight.is_cpu and _cpu_kernel_rows() > 0

    def decode_plan(self, layer, dtype):
        if self.kernel != "packed" or not _cpu_kernel_rows():
            return None
        from localchat import kernels

        call = kernels.cpu_int8_call(dtype, layer.in_features, layer.qweight, layer.scales,
                                     self._mins(layer), self.group_size)
        return None if call is None else ([call], layer.bias)

    def apply(self, layer, x):
        x2 = _flat(x)
        # CUDA: the Triton kernel. CPU: the C++ kernel for decode and verification rows
        # (batch-invariant, M <= CPU_MAX_ROWS); larger batches (prefill) dequantize blocks of
        # rows into the shared scratch (C++ where built, else PyTorch ops) for torch.mm.
        cpu_rows = _cpu_kernel_rows() if x2.device.type == "cpu" else 0
        packed = self.kernel == "packed"
        op = _kernel("int8_matmul") if packed and (
            x2.is_cuda or x2.shape[0] <= cpu_rows) else None
        if op is not None:
            y = op(x2, layer.qweight, layer.scales, self._mins(layer),
                   self.group_size).to(x.dtype)
        elif x2.device.type == "cpu":
            from .cpu_prefill import int8_prefill, torch_int8_prefill

            prefill = int8_prefill if packed and cpu_rows else torch_int8_prefill
            y = prefill(x2, layer.qweight, layer.scales, self._mins(layer), self.group_size)
        else:
            w = dequantize_int8_grouped(layer.qweight, layer.scales, self._mins(layer), x.dtype)
            y = F.linear(x2, w)
        return _add_bias(y, layer.bias).reshape(*x.shape[:-1], -1)

    def embed(self, layer, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids [n]`` of the weight, dequantized: ``[n, K]`` in ``dtype``."""
        mins = None if not self.has_mins else layer.mins[ids]
        return dequantize_int8_grouped(layer.qweight[ids], layer.scales[ids], mins, dtype)

    def dequantize_rows(self, layer, rows: slice | torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (a slice, or ids ``[n]`` int64) of the weight, dequantized: ``[n, K]``
        fp32 (the C++ ``int8_dequantize`` where built, else :meth:`embed`'s PyTorch ops)."""
        q, scales = layer.qweight[rows], layer.scales[rows]
        mins = None if not self.has_mins else layer.mins[rows]
        if not self.exact_cpu_rows(layer):
            return dequantize_int8_grouped(q, scales, mins, torch.float32)
        from localchat.kernels import cpu

        out = torch.empty(q.shape[0], layer.in_features, dtype=torch.float32)
        cpu.int8_dequantize(q, scales, mins, self.group_size, out)
        return out

    def weight_bytes(self, out_features, in_features, dtype):
        return int8_grouped_weight_bytes(out_features, in_features, self.group_size,
                                         self.has_mins, self.scale_dtype.itemsize)


class NativeInt4LinearMethod(Int4LinearMethod):
    """int4 groups of 32 (``q * scale + min``) filled from GGUF blocks rather than quantized
    here, scales and mins in ``scale_dtype``: fp16 for Q4_0 / Q4_1, uint8 for Q4_K's
    two-level form (plus ``super_scales`` fp16 ``[N, K // 256, 2]``, ``int4.py``; folded into
    fp32 at load where no kernel reads it, :meth:`_folds_kscales`), fp32 for a fused layer
    mixing the two; ``keep_rows`` keeps the contract layout (no CPU repack) so rows can be
    gathered (the embedding), computing with the dequantize path."""

    scheme = QuantScheme.NATIVE

    def __init__(self, device, kernel: str = "packed", keep_rows: bool = False,
                 scale_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(device, 32, "dequant" if keep_rows else kernel)
        self.scale_dtype = scale_dtype

    def create_weights(self, layer, device):
        n, k, g = layer.out_features, layer.in_features, self.group_size
        layer.weight = None
        _set_buffer(layer, "qweight", torch.empty(n, k // 2, dtype=torch.uint8, device=device))
        for name in ("scales", "mins"):
            _set_buffer(layer, name, torch.empty(n, k // g, dtype=self.scale_dtype,
                                                 device=device))
        if self.scale_dtype == torch.uint8:
            _set_buffer(layer, "super_scales", torch.empty(n, k // 256, 2, dtype=torch.float16,
                                                           device=device))

    def weight_bytes(self, out_features, in_features, dtype):
        # the int4pack repack keeps PyTorch's bf16 scales and zero points [K // G, N, 2];
        # otherwise the contract layout in scale_dtype (two-level: kscale_weight_bytes, or
        # folded to fp32 where no kernel reads it) is all there is
        if self._packed_cpu() and not self._own_cpu():
            return int4_weight_bytes(out_features, in_features, self.group_size, 2)
        if self.scale_dtype == torch.uint8:
            if self._folds_kscales():
                return int4_weight_bytes(out_features, in_features, self.group_size, 4)
            return kscale_weight_bytes(out_features, in_features)
        return int4_weight_bytes(out_features, in_features, self.group_size,
                                 self.scale_dtype.itemsize)

    def embed(self, layer, ids, dtype):
        """Rows ``ids`` (int64, any shape) of the weight, dequantized: ``[*ids.shape, K]`` in
        ``dtype``. On CPU the C++ ``int4_dequantize`` writes them where it is built (the
        1.5B's Q4_K embedding: 22 against 114 us for a decode step's row, 0.45 against 5.7
        ms for 512 prompt rows), the same fp32 values as ``dequantize_int4`` bit for bit."""
        flat = ids.reshape(-1)
        sup = layer._buffers.get("super_scales")
        rows = (layer.qweight[flat], layer.scales[flat], layer.mins[flat],
                None if sup is None else sup[flat])
        if layer.qweight.is_cpu and _cpu_kernel_rows():
            from localchat.kernels import cpu

            w = torch.empty(flat.shape[0], layer.in_features, dtype=torch.float32)
            cpu.int4_dequantize(*rows[:3], self.group_size, w, super_scales=rows[3])
        else:
            w = dequantize_int4(*rows[:3], torch.float32, rows[3])
        return w.reshape(*ids.shape, -1).to(dtype)


def float_embed(layer: nn.Module, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Embedding rows of a float weight ``[V, H]`` -> ``[n, H]``."""
    return F.embedding(ids, layer.weight).to(dtype)


# Q6_K's layout where int6 is not read (no C++ kernels, CUDA, the dequant kernel, a fused
# layer mixing it with other types unsplit): group-wise int8, groups of 16, fp32 scales
INT6_AS_INT8 = ("int8", 16, False, torch.float32)
# Q5_0's layout where int5 is not read (as for int6): group-wise int8, groups of 32, fp16
# scales (``gguf_repack``'s Q5_0 layout, what Q5_0 always held before int5)
INT5_AS_INT8 = ("int8", 32, False, torch.float16)


def native_method(layouts: list[tuple], device: torch.device | str,
                  kernel: str = "packed", keep_rows: bool = False,
                  shards: list[tuple[str | int, int]] | None = None,
                  split: bool = True) -> LinearMethod:
    """The method for one layer whose GGUF shards repack onto ``layouts`` (each ``(layout,
    group_size, has_mins, scale_dtype)``, one per shard, in output order).

    One layout for every shard (or a single shard): int4 when it is int4, group-wise int8 at
    its group (with mins when it has them), the float method for float; int6 (Q6_K) and int5
    (Q5_0) where the CPU kernels read them (``kernel == "packed"``, :func:`~.native_int6.
    int6_usable`, :func:`~.native_int5.int5_usable`), else their int8 layouts
    (:data:`INT6_AS_INT8`, :data:`INT5_AS_INT8`; int5's is taken before the shards' layouts are
    compared, so a Q5_0 shard beside a Q8_0 one shares its layer). Different quantized
    layouts: with ``split`` (the default) a :class:`~.sharded.ShardedLinearMethod` holding
    each shard in the method it would get alone, ``shards`` ``[(shard_id, rows)]`` (aligned
    with ``layouts``) naming them; without, the widest layout that holds every shard exactly
    (int4 values are int8 values, a group of 32 is two groups of 16 with equal scales, a
    missing min is 0; scales fp16 only when every shard's are, uint8 two-level only when
    every shard is Q4_K, else fp32: two-level scales fold exactly), what every mixed layer
    held before per-shard layouts. Any float shard: the float method.

    Raises ``ValueError`` when layouts differ, ``split`` is set and ``shards`` is missing or
    not aligned with ``layouts``.
    """
    kinds = {lay[0] for lay in layouts}
    if "float" in kinds:
        return LinearMethod()
    if "int5" in kinds:
        from .native_int5 import int5_usable

        if not (kernel == "packed" and int5_usable(device)):
            # int5's fallback before the split: Q5_0 shards beside Q8_0 ones (the 0.5B's
            # qkv_proj) then share one int8 layout and one matmul, as before int5
            layouts = [INT5_AS_INT8 if lay[0] == "int5" else lay for lay in layouts]
            kinds = {lay[0] for lay in layouts}
    if split and len(set(layouts)) > 1:
        if shards is None or len(shards) != len(layouts):
            raise ValueError(f"layouts {layouts} differ: the shards' ids and rows are needed, "
                             f"got {shards}")
        from .sharded import ShardedLinearMethod

        return ShardedLinearMethod([
            (sid, rows, native_method([lay], device, kernel, keep_rows))
            for (sid, rows), lay in zip(shards, layouts)])
    if "int6" in kinds:  # GGUF Q6_K: its own 6-bit layout where the CPU kernels read it
        from .native_int6 import Int6LinearMethod, int6_usable

        if kinds == {"int6"} and kernel == "packed" and int6_usable(device):
            return Int6LinearMethod(device)
        layouts = [INT6_AS_INT8 if lay[0] == "int6" else lay for lay in layouts]
        kinds = {lay[0] for lay in layouts}
    if "int5" in kinds:  # GGUF Q5_0: its own 5-bit layout (readable here, checked above)
        from .native_int5 import Int5LinearMethod

        if kinds == {"int5"}:
            return Int5LinearMethod(device)
        layouts = [INT5_AS_INT8 if lay[0] == "int5" else lay for lay in layouts]
        kinds = {lay[0] for lay in layouts}
    dtypes = {lay[3] for lay in layouts}
    sdtype = torch.float16 if dtypes == {torch.float16} else \
        torch.uint8 if dtypes == {torch.uint8} and kinds == {"int4"} else torch.float32
    if kinds == {"int4"}:
        return NativeInt4LinearMethod(device, kernel, keep_rows, sdtype)
    group = min(lay[1] for lay in layouts)
    has_mins = any(lay[2] for lay in layouts)
    return Int8GroupLinearMethod(device, group, has_mins, kernel, sdtype)


def _shard_target(layer: nn.Module, start: int, end: int) -> tuple[nn.Module, int, int]:
    """The module whose stored layout holds ``layer``'s output rows ``[start, end)`` and the
    rows relative to it: the shard's own module for a sharded layer (raises ``ValueError``
    when the rows cross shards), else ``layer`` itself."""
    from .sharded import ShardedLinearMethod

    method = layer.quant_method
    if isinstance(method, ShardedLinearMethod):
        return method.locate(layer, start, end)
    return layer, start, end


def repack_into_rows(layer: nn.Module, raw, ggml_type: int, shape: tuple[int, int],
                     start: int, end: int, source_rows: torch.Tensor | None = None,
                     tensor_name: str = "?") -> bool:
    """Repack GGUF tensor bytes ``raw`` (``shape [end - start, K]``) straight into rows
    ``[start, end)`` of ``layer``'s stored layout with the C++ op (``gguf_repack.
    repack_gguf_into``; ``source_rows`` an optional row permutation): no intermediate tensor.
    Only where the layer's layout is the tensor's own (same int4 / int8 layout, group size,
    scale dtype and mins); returns False, writing nothing, otherwise or without the C++
    kernels (the caller then repacks and calls :func:`copy_repacked_rows`). For a sharded
    layer (``sharded.py``) the rows go to the shard module holding them, relative to it.

    Raises ``ValueError`` on a shape mismatch, ``ModelLoadError`` on a corrupt tensor.
    """
    from .gguf_repack import GGML_TYPES, repack_gguf_into, repacked_group, scale_dtype
    from .native_int5 import Int5LinearMethod, repack_int5_rows
    from .native_int6 import Int6LinearMethod, repack_int6_rows

    layer, start, end = _shard_target(layer, start, end)
    method = layer.quant_method
    if isinstance(method, Int6LinearMethod):  # chosen only where the C++ op is built
        repack_int6_rows(layer, raw, shape, start, end, source_rows, tensor_name)
        return True
    if isinstance(method, Int5LinearMethod):  # likewise
        repack_int5_rows(layer, raw, shape, start, end, source_rows, tensor_name)
        return True
    layout = GGML_TYPES[ggml_type][3] if ggml_type in GGML_TYPES else None
    if layout not in ("int4", "int8") or len(shape) != 2 or layer.qweight.device.type != "cpu":
        return False
    n, k = shape
    if n != end - start or k != layer.in_features:
        raise ValueError(f"shape mismatch: checkpoint {[n, k]}, model "
                         f"{[end - start, layer.in_features]}")
    group, has_mins = repacked_group(ggml_type)
    sdtype = scale_dtype(ggml_type)
    if isinstance(method, NativeInt4LinearMethod):
        same = layout == "int4" and method.scale_dtype == sdtype
    elif isinstance(method, Int8GroupLinearMethod):
        same = (layout == "int8" and method.group_size == group
                and method.has_mins == has_mins and method.scale_dtype == sdtype)
    else:
        same = False
    if not same:
        return False
    mins = layer.mins[start:end] if has_mins else None
    sup = layer._buffers.get("super_scales")
    return repack_gguf_into(raw, ggml_type, shape, layer.qweight[start:end],
                            layer.scales[start:end], mins, source_rows, tensor_name,
                            None if sup is None else sup[start:end])


def copy_repacked_rows(layer: nn.Module, w, start: int, end: int) -> None:
    """Copy ``RepackedWeight`` ``w`` (``[end - start, K]``) into rows ``[start, end)`` of
    ``layer``'s stored layout (for a sharded layer, of the shard module holding them),
    widening int4 -> int8 and groups 32 -> 16 exactly where that layout is wider.

    Raises ``ValueError`` on a shape mismatch or rows that cross shards.
    """
    from .int4 import unpack_int4

    layer, start, end = _shard_target(layer, start, end)
    method = layer.quant_method
    n, k = w.shape
    if n != end - start or k != layer.in_features:
        want = [end - start, layer.in_features]
        raise ValueError(f"shape mismatch: checkpoint {[n, k]}, model {want}")
    sup = layer._buffers.get("super_scales")
    if isinstance(method, NativeInt4LinearMethod) and sup is not None:
        layer.qweight[start:end].copy_(w.qweight)
        layer.scales[start:end].copy_(w.scales)
        layer.mins[start:end].copy_(w.mins)
        sup[start:end].copy_(w.super_scales)
        return
    scales, mins = w.folded()
    if isinstance(method, NativeInt4LinearMethod):
        layer.qweight[start:end].copy_(w.qweight)
        layer.scales[start:end].copy_(scales)
        layer.mins[start:end].copy_(mins)
        return
    q = unpack_int4(w.qweight).to(torch.int8) if w.layout == "int4" else w.qweight
    rep = w.group_size // method.group_size
    layer.qweight[start:end].copy_(q)
    layer.scales[start:end].copy_(scales.repeat_interleave(rep, dim=1))
    if method.has_mins:
        if mins is None:
            layer.mins[start:end].zero_()
        else:
            layer.mins[start:end].copy_(mins.repeat_interleave(rep, dim=1))
