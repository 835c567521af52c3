"""The panel layout of int8 weights (GGUF Q8_0) on CPUs with AVX-512 VNNI.

The group-wise int8 row layout (``native.Int8GroupLinearMethod``: ``qweight`` int8 ``[N, K]``,
``scales`` fp16 ``[N, K // 32]``) keeps each output's bytes together; its integer-dot kernel
reduces the lanes of every output and scales each one apart, so 8 activation rows cost about
3x one (SmolLM2's tied Q8_0 output layer: 3.5 ms against 1.1 at one row). ``kernels/cpu/
panel8.h`` interleaves 16 outputs as the int4 panel does (``int4_panel.py``): one
``vpdpbusd`` lane is one output and the scales apply once per 32 columns for 16 outputs. The
bytes are the row layout's, permuted (:func:`to_panel8` / :func:`from_panel8`, exact
inverses):

- ``qpanel`` int8 ``[N / 16, K / 4, 64]``: byte ``4 j + b`` of (tile ``t``, quad ``c``) holds
  ``q[16 t + j, 4 c + b]``;
- ``pscales`` fp16 ``[N / 16, K / 32, 16]``.

:class:`PanelInt8LinearMethod` holds a native Q8_0 layer so (``load_native_gguf`` converts it
once its rows are filled, before the cache write; ``int4_panel.adopt_panel`` picks the
layers, the output layer and a tied embedding included) and computes up to
``kernels.CPU_MAX_ROWS`` rows with ``kernels.cpu.int8_panel_a8`` (batch invariant); longer
prompts take the row layout's prefill GEMM over weights dequantized from the tiles
(``kernels.cpu.int8_panel_dequantize``, the row layout's values), and rows read back (a tied
embedding's lookup, the greedy head's rescoring) dequantize from the tiles that hold them.
"""

from __future__ import annotations

import torch

from .native import Int8GroupLinearMethod
from .panel_method import ROWS, PanelMixin, from_tiles, to_tiles

_ROW_NAMES = ("qweight", "scales")
_PANEL_NAMES = ("qpanel", "pscales")


def _check(n: int, k: int) -> None:
    if n % ROWS or k % 32 or n <= 0 or k <= 0:
        raise ValueError(f"the int8 panel layout needs N % 16 == 0 and K % 32 == 0, got "
                         f"N={n}, K={k}")


def to_panel8(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-layout int8 (``qweight`` int8 ``[N, K]``, ``scales`` fp16 ``[N, K // 32]``) ->
    ``(qpanel, pscales)`` (module docstring), new contiguous tensors holding the same bytes.
    The reference of the C++ ``kernels.cpu.int8_to_panel``. Raises ``ValueError`` unless
    ``N % 16 == 0`` and ``K % 32 == 0``."""
    n, k = qweight.shape
    _check(n, k)
    return to_tiles(qweight, n, 4), to_tiles(scales, n, 1)


def from_panel8(qpanel: torch.Tensor, pscales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of :func:`to_panel8`: ``(qweight, scales)`` of the row layout, bit for
    bit."""
    return from_tiles(qpanel, 4), from_tiles(pscales, 1)


def dequantize_panel8(qpanel: torch.Tensor, pscales: torch.Tensor) -> torch.Tensor:
    """Panel tiles -> fp32 ``[16 T, K]``: ``q * scale``, the row layout's
    ``dequantize_int8_grouped`` values bit for bit (``gguf.quants.dequantize``'s for Q8_0)."""
    q, s = from_panel8(qpanel, pscales)
    n, k = q.shape
    return (q.float().view(n, k // 32, 32) * s.float()[..., None]).view(n, k)


def panel8_fits(layer) -> bool:
    """Whether ``layer`` holds a Q8_0-form int8 weight the panel tiles: ``Int8GroupLinearMethod``
    with groups of 32, fp16 scales, no mins, the packed kernels, N % 16 == 0, K % 32 == 0."""
    method = layer.quant_method
    return (type(method) is Int8GroupLinearMethod and method.group_size == 32
            and not method.has_mins and method.scale_dtype == torch.float16
            and method.kernel == "packed" and layer.out_features % ROWS == 0
            and layer.in_features % 32 == 0)


class PanelInt8LinearMethod(PanelMixin, Int8GroupLinearMethod):
    """A native Q8_0 layer in the panel layout (module docstring) once :meth:`to_panel` ran;
    before that (while its rows are filled) the row layout of ``Int8GroupLinearMethod``
    (groups of 32, fp16 scales). ``apply(layer, x [..., K])`` -> ``[..., N]`` in ``x.dtype``
    through ``kernels.cpu.int8_panel_a8`` for up to ``kernels.CPU_MAX_ROWS`` rows, the row
    layout's prefill GEMM beyond (``PanelMixin._prompt``)."""

    _OP = "int8_panel_a8"
    _PANEL_NAMES = _PANEL_NAMES

    def __init__(self, device) -> None:
        super().__init__(device, 32, False, "packed", torch.float16)
        self.panel = False

    def to_panel(self, layer, convert: bool = True) -> None:
        """Replace the row-layout buffers by panel ones: converted (``convert``) or empty (to
        be mapped from a cache entry that holds them)."""
        n, k = layer.out_features, layer.in_features
        _check(n, k)
        tensors = [torch.empty(n // ROWS, k // 4, 64, dtype=torch.int8),
                   torch.empty(n // ROWS, k // 32, ROWS, dtype=torch.float16)]
        from localchat.kernels import cpu  # (converting only where the kernels are built)

        self._install(layer, _ROW_NAMES, tensors, (lambda: cpu.int8_to_panel(
            *(layer._buffers[name] for name in _ROW_NAMES), *tensors)) if convert else None)

    _F32_OP = "int8_panel_f32"

    def _rows_op(self, layer):
        return "int8_panel_dequantize", self._panel(layer)

    def _gather_op(self, layer):
        return "int8_panel_gather", self._panel(layer)

    def _dequantize_tiles(self, *tiles: torch.Tensor) -> torch.Tensor:
        return dequantize_panel8(*tiles)
