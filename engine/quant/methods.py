"""Linear methods: how a ``Linear`` layer stores its weight and computes ``x @ W.T + b``.

One object per layer sits behind ``Linear.forward`` (vLLM's ``LinearMethodBase`` pattern).
Life cycle: the loader fills the layer's float ``weight [N, K]``; ``quantize_weights`` turns it
into the scheme's layout (the one the cache stores and the Triton kernels read) and frees the
float copy; after loading (or after reading the cache, through ``create_weights``),
``process_weights_after_loading`` converts to what the device's kernel reads fastest.

CPU kernels: int8 uses ``torch.ops.aten._weight_int8pack_mm`` (bf16 activations, cast back)
for up to ``CPU_MAX_ROWS`` rows and, where the C++ kernels are built, row blocks dequantized
for ``torch.mm`` beyond (``cpu_prefill.py``);
int4 (``int4_method.py``) localchat's exact C++ kernels over its own layout (``cpu_int4.py``)
where they are built, else ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (bf16 activations
and scales); ``kernel="dequant"`` dequantizes to the activation
dtype and calls ``F.linear`` (the reference, and the CUDA path until ``localchat.kernels``
provides ``int8_matmul`` / ``int4_matmul``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localchat import kernels as _kernels

from .fp8 import dequantize_fp8, fp8_linear, fp8_weight_bytes, quantize_fp8
from .int4 import pick_group_size
from .int8 import dequantize_int8, int8_weight_bytes, quantize_int8
from .schemes import QuantScheme

# (parts, bias) of LinearMethod.decode_plan
DecodePlan = tuple[list[tuple[str, tuple]], "torch.Tensor | None"]

_CPU_MAX_ROWS = _kernels.CPU_MAX_ROWS


def _set_buffer(layer: nn.Module, name: str, tensor: torch.Tensor) -> None:
    if name in layer._buffers:
        del layer._buffers[name]
    layer.register_buffer(name, tensor)


def _drop(layer: nn.Module, *names: str) -> None:
    for name in names:
        layer._buffers.pop(name, None)


def _kernel(name: str):
    """``localchat.kernels.<name>`` (the Triton op on CUDA) or ``None`` if not provided."""
    from localchat import kernels

    return getattr(kernels, name, None)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _cpu_prefill(rows: int) -> bool:
    from .cpu_prefill import cpp_prefill

    return cpp_prefill(rows)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y.add_(bias)


class LinearMethod:
    """Base class; the unquantized method (weight ``[N, K]`` in the model dtype).

    ``apply(layer, x [..., K]) -> [..., N]`` in x's dtype. On CPU in fp32 the weight is kept
    transposed (``layer.weight_t [K, N]``): ``torch.mm`` over it runs batch-1 decode about 1.2x
    faster than ``F.linear`` here (MKL's sgemv streams that layout closer to memory bandwidth;
    ``scripts/bench_decode.py``); bf16 and CUDA keep ``[N, K]``. CPU calls of at most
    ``CPU_MAX_ROWS`` rows (decode, draft verification) run localchat's C++ float matmul over
    either layout where it is built (``kernels.cpu.float_matmul`` / ``float_matmul_t``): fp32
    accumulation in an order fixed by K, so row i of an M-row call equals the 1-row call bit
    for bit, which MKL / oneDNN do not guarantee (greedy output with a draft would drift from
    plain greedy); larger batches (prefill) keep ``torch.mm`` / ``F.linear``.
    """

    scheme = QuantScheme.NONE

    def quantize_weights(self, layer: nn.Module) -> None:
        """Float ``layer.weight`` -> this scheme's stored layout (nothing to do here)."""

    def exact_cpu_rows(self, layer: nn.Module) -> bool:
        """Whether this CPU layer's calls of at most ``CPU_MAX_ROWS`` fp32 rows run localchat's
        exact fp32-activation C++ matmul (outside ``kernels.a8_fp32``): ``Linear.forward``
        then runs a short prefill as such calls (``kernels.short_prefill_chunks``). Not for
        float weights (``torch.mm`` is as fast for them) nor for layers on PyTorch's
        int8pack / int4pack kernels (bf16 activations)."""
        return False

    def short_prefill_rows(self, layer: nn.Module) -> int:
        """The most fp32 prefill rows ``Linear.forward`` runs on this layer as 16-row chunks
        of its exact C++ row kernels (``kernels.short_prefill_chunks``), else its GEMM; 0
        without such kernels, ``kernels.SHORT_PREFILL_MAX_ROWS`` by default, less where
        the row kernels cost more per row (``PlanarLinearMethod``)."""
        return _kernels.SHORT_PREFILL_MAX_ROWS if self.exact_cpu_rows(layer) else 0

    def create_weights(self, layer: nn.Module, device: torch.device) -> None:
        """Allocate empty stored-layout tensors (to be filled from the cache)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        w = layer.weight
        if w is None or w.device.type != "cpu" or w.dtype != torch.float32:
            return
        layer.weight_t = w.data.t().contiguous()
        layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if x.is_cpu and x.dim() == 2 and x.shape[0] <= _kernels.CPU_MAX_ROWS:
            cpu = _kernels._cpu()
            if cpu is not None:  # decode / draft verification: the batch-invariant C++ matmul
                if layer.weight_t is not None:
                    return cpu.float_matmul_t(x, layer.weight_t, layer.bias)
                return cpu.float_matmul(x, layer.weight, layer.bias)
        if layer.weight_t is not None:
            y = torch.mm(_flat(x), layer.weight_t).reshape(*x.shape[:-1], -1)
            return _add_bias(y, layer.bias)
        return F.linear(x, layer.weight, layer.bias)

    def apply_prefix(self, layer: nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` outputs of :meth:`apply` (``x [..., K]`` -> ``[..., n]``, a draft
        model's vocabulary prefix, ``spec_decode.proposer``): a float weight reads only its
        first ``n`` rows (``[N, K]``, or the first ``n`` columns of the CPU's fp32 ``[K, N]``),
        the panel layouts only their first ``n / 16`` tiles (``panel_method.PanelMixin``);
        other layouts compute all ``N`` and cut."""
        bias = None if layer.bias is None else layer.bias[:n]
        if layer.weight is not None:
            return F.linear(x, layer.weight[:n], bias)
        if layer.weight_t is not None:
            y = torch.mm(_flat(x), layer.weight_t[:, :n]).reshape(*x.shape[:-1], -1)
            return _add_bias(y, bias)
        return self.apply(layer, x)[..., :n]

    def weight_bytes(self, out_features: int, in_features: int, dtype: torch.dtype) -> int:
        """Bytes the layer's weight occupies once loaded (bias not included)."""
        return out_features * in_features * dtype.itemsize

    def decode_plan(self, layer: nn.Module, dtype: torch.dtype) -> DecodePlan | None:
        """What :meth:`apply` computes for CPU activations ``[M, K]`` of ``dtype`` with ``M <=
        CPU_MAX_ROWS``, as C++ op calls (for ``kernels/cpu/stack_ops.cpp``): ``(parts, bias)``,
        ``parts`` a list of ``(op name in torch.ops.localchat_cpu, arguments with
        kernels.INPUT in the input's place)`` whose outputs, concatenated on the last dim,
        plus ``bias`` (or None) are the layer's output, bit for bit. None where apply would
        run anything else (no C++ kernels, a PyTorch kernel, a reference)."""
        cpu = _kernels._cpu()
        if cpu is None or type(self).apply is not LinearMethod.apply:
            return None
        isa = cpu.active_isa()
        if layer.weight_t is not None:
            return [("float_matmul_t", (_kernels.INPUT, layer.weight_t, layer.bias, isa))], None
        return [("float_matmul", (_kernels.INPUT, layer.weight, layer.bias, isa, False))], None


class _PerChannelLinearMethod(LinearMethod):
    """Shared weight handling of the per-output-channel schemes (int8, fp8): a ``qweight``
    ``[N, K]`` of ``qdtype`` and fp32 ``scales [N]`` from ``quantize(weight)``."""

    qdtype: torch.dtype  # set by subclasses, with ``quantize``: weight -> (qweight, scales)

    def __init__(self, device: torch.device, kernel: str = "packed") -> None:
        self.device = torch.device(device)
        self.kernel = kernel

    def quantize_weights(self, layer):
        qweight, scales = self.quantize(layer.weight.data)
        layer.weight = None
        _set_buffer(layer, "qweight", qweight)
        _set_buffer(layer, "scales", scales)

    def create_weights(self, layer, device):
        n, k = layer.out_features, layer.in_features
        layer.weight = None
        _set_buffer(layer, "qweight", torch.empty(n, k, dtype=self.qdtype, device=device))
        _set_buffer(layer, "scales", torch.empty(n, dtype=torch.float32, device=device))


class Int8LinearMethod(_PerChannelLinearMethod):
    """W8A16 int8 per output channel (``int8.py``). ``kernel``: "packed" (CPU
    ``_weight_int8pack_mm``; on CUDA ``localchat.kernels.int8_matmul`` when present) or
    "dequant"."""

    scheme = QuantScheme.INT8
    qdtype = torch.int8
    quantize = staticmethod(quantize_int8)

    def _packed_cpu(self) -> bool:
        return self.device.type == "cpu" and self.kernel == "packed"

    def process_weights_after_loading(self, layer):
        if self._packed_cpu():  # the CPU kernel wants scales in the activation dtype (bf16)
            _set_buffer(layer, "scales", layer.scales.to(torch.bfloat16))

    def apply(self, layer, x):
        x2 = _flat(x)
        if self._packed_cpu() and _cpu_prefill(x2.shape[0]):
            # prefill: row blocks dequantized by the C++ int8_dequantize for torch.mm (bf16
            # for bf16 x); _weight_int8pack_mm took 6x a bf16 GEMM's time at 512 rows here
            from .cpu_prefill import int8_prefill

            y = int8_prefill(x2, layer.qweight, layer.scales.float(), None, x2.shape[1])
        elif self._packed_cpu():
            y = torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16), layer.qweight,
                                                   layer.scales).to(x.dtype)
        elif x.is_cuda and self.kernel == "packed" and _kernel("int8_matmul") is not None:
            y = _kernel("int8_matmul")(x2, layer.qweight, layer.scales)
        else:
            y = F.linear(x2, dequantize_int8(layer.qweight, layer.scales, x.dtype))
        return _add_bias(y, layer.bias).reshape(*x.shape[:-1], -1)

    def weight_bytes(self, out_features, in_features, dtype):
        return int8_weight_bytes(out_features, in_features, 2 if self._packed_cpu() else 4)


class Fp8LinearMethod(_PerChannelLinearMethod):
    """FP8 e4m3 per output channel through ``torch._scaled_mm`` (``fp8.py``); CUDA cc >= 8.9.
    ``kernel="dequant"`` dequantizes instead (the reference)."""

    scheme = QuantScheme.FP8
    qdtype = torch.float8_e4m3fn
    quantize = staticmethod(quantize_fp8)

    def process_weights_after_loading(self, layer):
        pass

    def apply(self, layer, x):
        x2 = _flat(x)
        if x.is_cuda and self.kernel == "packed":
            y = fp8_linear(x2, layer.qweight, layer.scales, layer.bias)
        else:
            y = _add_bias(F.linear(x2, dequantize_fp8(layer.qweight, layer.scales, x.dtype)),
                          layer.bias)
        return y.reshape(*x.shape[:-1], -1)

    def weight_bytes(self, out_features, in_features, dtype):
        return fp8_weight_bytes(out_features, in_features)


def make_linear_method(
    scheme: QuantScheme, device: torch.device | str, in_features: int,
    group_size: int = 128, kernel: str = "packed",
) -> LinearMethod:
    """The linear method for one layer of ``in_features`` inputs under ``scheme``.

    int4 picks the layer's group size with :func:`pick_group_size`; a layer whose
    ``in_features`` no group size divides gets the unquantized method.
    """
    device = torch.device(device)
    if scheme is QuantScheme.INT8:
        return Int8LinearMethod(device, kernel)
    if scheme is QuantScheme.INT4:
        from .int4_method import Int4LinearMethod

        g = pick_group_size(in_features, group_size)
        return Int4LinearMethod(device, g, kernel) if g else LinearMethod()
    if scheme is QuantScheme.FP8:
        return Fp8LinearMethod(device, kernel)
    return LinearMethod()
