"""The group-wise int4 linear method (``Int4LinearMethod``, W4A16; ``int4.py`` holds the
format's maths): localchat's exact C++ kernels over its own layout on the CPU where they are
built (``cpu_int4.py``), else PyTorch's ``_weight_int4pack_mm_for_cpu`` over a repacked copy;
``localchat.kernels.int4_matmul`` on CUDA; ``kernel="dequant"`` the reference. The GGUF
``native`` int4 layer (``native.NativeInt4LinearMethod``) builds on it."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from localchat import kernels as _kernels

from .int4 import (
    dequantize_int4,
    fold_kscales,
    int4_weight_bytes,
    quantize_int4,
    to_cpu_int4pack,
)
from .methods import (
    _CPU_MAX_ROWS,
    LinearMethod,
    _add_bias,
    _drop,
    _flat,
    _kernel,
    _set_buffer,
)
from .schemes import QuantScheme


@functools.cache
def _int4pack_mm():
    """``torch.ops.aten._weight_int4pack_mm_for_cpu``, looked up once (an op-namespace
    attribute read per call costs a microsecond)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu


class Int4LinearMethod(LinearMethod):
    """W4A16 int4 group-wise (``int4.py``), ``group_size`` chosen per layer by
    :func:`pick_group_size` (the loader leaves layers without one unquantized). ``kernel``:
    "packed" (CPU: localchat's exact C++ kernels over the contract layout where they are built,
    ``cpu_int4.py``, else ``_weight_int4pack_mm_for_cpu`` over a repacked copy, see
    ``_own_cpu``; on CUDA ``localchat.kernels.int4_matmul`` when present) or "dequant"."""

    scheme = QuantScheme.INT4

    def __init__(self, device: torch.device, group_size: int, kernel: str = "packed") -> None:
        self.device = torch.device(device)
        self.group_size = group_size
        self.kernel = kernel
        self._int4pack = False  # set once the layer holds PyTorch's int4pack repack

    def _packed_cpu(self) -> bool:
        return self.device.type == "cpu" and self.kernel == "packed"

    def quantize_weights(self, layer):
        qweight, scales, mins = quantize_int4(layer.weight.data, self.group_size)
        layer.weight = None
        _set_buffer(layer, "qweight", qweight)
        _set_buffer(layer, "scales", scales)
        _set_buffer(layer, "mins", mins)

    def create_weights(self, layer, device):
        n, k, g = layer.out_features, layer.in_features, self.group_size
        layer.weight = None
        _set_buffer(layer, "qweight", torch.empty(n, k // 2, dtype=torch.uint8, device=device))
        _set_buffer(layer, "scales", torch.empty(n, k // g, dtype=torch.float32, device=device))
        _set_buffer(layer, "mins", torch.empty(n, k // g, dtype=torch.float32, device=device))

    def _own_cpu(self) -> bool:
        """Whether this CPU layer computes with localchat's kernels over the contract layout
        alone (``cpu_int4.py``: the exact C++ matmul for up to ``CPU_MAX_ROWS`` rows, row-block
        GEMMs for prefill) whenever they are built; else (no C++ kernels, or
        ``LOCALCHAT_CPU_INT4=int4pack``) it repacks for PyTorch's int4pack kernel, which rounds
        scales and mins to bf16."""
        from .cpu_int4 import own_kernels

        return self._packed_cpu() and own_kernels()

    def replaces_weights_on_load(self) -> bool:
        """Whether :meth:`process_weights_after_loading` swaps this CPU layer's loaded tensors
        for new ones (PyTorch's int4pack repack, with two-level scales folded first): only
        where PyTorch's kernel computes (``_packed_cpu`` without ``_own_cpu``). A cached load
        copies such a layer's tensors rather than mapping them; every other layer computes
        over the loaded tensors as they are, so a view of the mapped cache serves it."""
        return self._packed_cpu() and not self._own_cpu()

    def _folds_kscales(self) -> bool:
        """Whether two-level (GGUF Q4_K) scales are folded into fp32 at load: only localchat's
        CPU kernels and the CPU dequantize path read them in place."""
        return self.device.type != "cpu" or (self._packed_cpu() and not self._own_cpu())

    def process_weights_after_loading(self, layer):
        sup = layer._buffers.get("super_scales")
        if sup is not None and self._folds_kscales():
            scales, mins = fold_kscales(layer.scales, layer.mins, sup)
            _drop(layer, "scales", "mins", "super_scales")
            _set_buffer(layer, "scales", scales)
            _set_buffer(layer, "mins", mins)
        if self._packed_cpu() and not self._own_cpu():
            packed, scales_and_zeros = to_cpu_int4pack(layer.qweight, layer.scales, layer.mins)
            _drop(layer, "qweight", "scales", "mins")
            _set_buffer(layer, "qweight_cpu", packed)
            _set_buffer(layer, "scales_and_zeros", scales_and_zeros)
            self._int4pack = True

    def exact_cpu_rows(self, layer) -> bool:
        return (self._packed_cpu() and getattr(layer, "qweight", None) is not None
                and self._own_cpu())

    def _a8_direct(self, layer) -> bool:
        """Whether decode rows of this CPU layer may call the W4A8 op directly: own C++
        kernels and a layout it reads in place (decided once per layer, on first use)."""
        ok = layer.__dict__.get("_cpu_a8_direct")
        if ok is None:
            ok = (self._packed_cpu() and getattr(layer, "qweight", None) is not None
                  and self._own_cpu() and _kernels.int4_a8_layout_ok(
                      layer.qweight, layer.scales, layer.mins, self.group_size,
                      layer._buffers.get("super_scales")))
            layer.__dict__["_cpu_a8_direct"] = ok
        return ok

    def decode_plan(self, layer, dtype):
        # both of apply's paths over localchat's kernels (the direct W4A8 call and
        # int4_linear's kernels.int4_matmul) make the call kernels.cpu_int4_call describes
        if not (self._packed_cpu() and getattr(layer, "qweight", None) is not None
                and self._own_cpu()):
            return None
        call = _kernels.cpu_int4_call(dtype, layer.in_features, layer.qweight, layer.scales,
                                      layer.mins, self.group_size,
                                      layer._buffers.get("super_scales"))
        return None if call is None else ([call], layer.bias)

    def apply(self, layer, x):
        if x.dim() == 2 and x.shape[0] <= _CPU_MAX_ROWS and self._a8_direct(layer) \
                and _kernels.cpu_a8_enabled(x.dtype):
            # the decode path: the op itself, no per-call dispatch (kernels.int4_matmul
            # would take the same kernel after re-checking the layout)
            y = torch.ops.localchat_cpu.int4_matmul_a8(
                x, layer.qweight, layer.scales, layer.mins, self.group_size,
                _kernels.cpu.int4_a8_isa(), layer._buffers.get("super_scales"))
            return y if layer.bias is None else y.add_(layer.bias)
        if self._int4pack and x.dtype == torch.bfloat16 and x.dim() == 2:
            # the decode path on CPU: one op, no no-op casts / reshapes (some 480 ATen calls
            # a SmolLM2 step otherwise)
            y = _int4pack_mm()(x, layer.qweight_cpu, self.group_size, layer.scales_and_zeros)
            return y if layer.bias is None else y.add_(layer.bias)
        x2 = _flat(x)
        sup = layer._buffers.get("super_scales")
        if self._packed_cpu() and getattr(layer, "qweight", None) is not None \
                and self._own_cpu():
            from .cpu_int4 import int4_linear

            y = int4_linear(x2, layer.qweight, layer.scales, layer.mins,
                            self.group_size, sup).to(x.dtype)
        elif self._packed_cpu():
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16), layer.qweight_cpu, self.group_size, layer.scales_and_zeros
            ).to(x.dtype)
        elif x.is_cuda and self.kernel == "packed" and _kernel("int4_matmul") is not None:
            y = _kernel("int4_matmul")(x2, layer.qweight, layer.scales, layer.mins,
                                           self.group_size, super_scales=sup)
        else:
            w = dequantize_int4(layer.qweight, layer.scales, layer.mins, x.dtype, sup)
            y = F.linear(x2, w)
        return _add_bias(y, layer.bias).reshape(*x.shape[:-1], -1)

    def weight_bytes(self, out_features, in_features, dtype):
        # the int4pack repack keeps scales and PyTorch's zero points as bf16 [K // G, N, 2];
        # otherwise the contract layout (fp32 scales / mins) is all there is
        if self._packed_cpu() and not self._own_cpu():
            return int4_weight_bytes(out_features, in_features, self.group_size, 2)
        return int4_weight_bytes(out_features, in_features, self.group_size, 4)
