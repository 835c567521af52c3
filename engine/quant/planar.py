"""The shared shape of the low-bit GGUF layouts held in bit planes (int6 for Q6_K,
``native_int6.py``; int5 for Q5_0, ``native_int5.py``): one linear method whose CPU kernels
come as a set of three (integer-dot decode, exact fp32-activation decode, row dequantization
for prefill) over the layer's planes.

``apply(layer, x [..., K]) -> [..., N]`` in ``x.dtype``: up to ``kernels.CPU_MAX_ROWS`` rows
through the integer-dot kernel where ``kernels.cpu_a8_enabled`` (16-bit activations, or the
output layer under ``kernels.a8_fp32``) else the exact one; more rows (prefill) through row
blocks dequantized into a shared scratch for ``torch.mm`` (``cpu_prefill.blockwise_mm``).
``embed(layer, ids [n], dtype) -> [n, K]`` dequantizes only the rows read, with the layout's
PyTorch reference.
"""

from __future__ import annotations

import torch

from localchat import kernels

from .methods import LinearMethod, _add_bias, _flat
from .schemes import QuantScheme

# The most prefill rows a bit-plane (int5 / int6) layer runs as 16-row chunks of its exact row
# kernels (PlanarLinearMethod.short_prefill_rows); more take its prefill GEMM.
PLANAR_SHORT_PREFILL_ROWS = 24


class PlanarLinearMethod(LinearMethod):
    """Base of the bit-plane layouts: a subclass names its buffers (``_weights``) and its
    kernels (``_matmul_a8``, ``_matmul``, ``_dequantize``: ``localchat.kernels.cpu``
    functions taking the weights in ``_weights`` order; their references are in
    ``localchat.kernels.reference_int{5,6}``), and creates the buffers itself."""

    scheme = QuantScheme.NATIVE

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def _weights(self, layer) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def _matmul_a8(self, x, *w):
        raise NotImplementedError

    def _matmul(self, x, *w):
        raise NotImplementedError

    def _dequantize(self, *w_and_out) -> None:
        raise NotImplementedError

    # the layout's AMX prefill GEMM (``localchat.kernels.cpu.int{5,6}_dequant_mm``: x, *weights
    # -> x @ w.T), or None
    _dequant_mm = None

    def process_weights_after_loading(self, layer):
        pass

    def decode_plan(self, layer, dtype):
        if kernels._cpu() is None:
            return None
        op = self._matmul_a8 if kernels.cpu_a8_enabled(dtype) else self._matmul
        # the layout's kernels.cpu wrappers call the op of their own name with (x, *w, isa)
        return [(op.__name__, (kernels.INPUT, *self._weights(layer),
                               kernels.cpu.active_isa()))], layer.bias

    def exact_cpu_rows(self, layer):
        return self._weights(layer)[0].is_cpu

    def short_prefill_rows(self, layer):
        # The bit-plane row kernels decode each column's weights once per 4-row tile, so the
        # prefill GEMM overtakes 16-row chunks sooner than for int4: measured on a 2-core AVX2
        # EPYC, 2 threads, chunks / GEMM ms, Qwen2.5-Coder-0.5B's Q5_0 4864 x 896 gate/up at
        # 17 / 24 / 32 / 48 rows 6.0/9.7, 7.8/9.2, 10.1/10.0, 15.1/11.5; its Q6_K down 3.2/3.8,
        # 4.2/4.4, 5.3/4.1, 6.6/4.9; the 1.5B's Q6_K 1536 x 8960 down 14.7/16.5, 17.9/17.8 at
        # 17 / 24, 17.2/13.0 at 32.
        return PLANAR_SHORT_PREFILL_ROWS if self.exact_cpu_rows(layer) else 0

    def apply(self, layer, x):
        x2 = _flat(x)
        w = self._weights(layer)
        if x2.shape[0] <= kernels.CPU_MAX_ROWS:
            op = self._matmul_a8 if kernels.cpu_a8_enabled(x2.dtype) else self._matmul
            y = op(x2, *w)  # in x's dtype
            if x.dim() == 2:  # decode rows: no no-op casts / reshapes (an ATen call each)
                return y if layer.bias is None else y.add_(layer.bias)
        else:
            from .cpu_prefill import blockwise_mm

            def fill(a: int, b: int, out: torch.Tensor) -> None:
                self._dequantize(*(t[a:a + b] for t in w), out)

            amx = None if self._dequant_mm is None else (lambda xb: self._dequant_mm(xb, *w))
            y = blockwise_mm(x2, layer.out_features, layer.in_features, fill, amx=amx,
                             key=w[0].data_ptr())
        return _add_bias(y.to(x.dtype), layer.bias).reshape(*x.shape[:-1], -1)

    def embed(self, layer, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (int64, any shape) of the weight, dequantized by the C++ kernel
        (:meth:`dequantize_rows`; a decode step's lookup in the 0.5B's Q5_0 embedding 43 us
        against 128 us through the PyTorch reference): ``[*ids.shape, K]`` in ``dtype``."""
        rows = self.dequantize_rows(layer, ids.reshape(-1))
        return rows.reshape(*ids.shape, -1).to(dtype)

    def dequantize_rows(self, layer, rows: slice | torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (a slice, or ids ``[n]`` int64) of the weight, dequantized by the C++
        kernel: ``[n, K]`` fp32, equal to the layout's PyTorch reference dequantization bit
        for bit at a fraction of its time (embedding lookups; the whole output layer once per
        first load and a few candidate rows per greedy token, ``layers/greedy_head.py``)."""
        w = [t[rows] for t in self._weights(layer)]
        out = torch.empty(w[0].shape[0], layer.in_features, dtype=torch.float32)
        self._dequantize(*w, out)
        return out
