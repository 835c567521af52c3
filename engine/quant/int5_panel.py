"""The panel layout of int5 weights (GGUF Q5_0) on CPUs with AVX2.

The int5 row layout (``int5_layout.py``, ``native_int5.py``: ``qlow [N, K // 2]``, ``qhigh
[N, K // 8]``, ``scales [N, K // 32]`` fp16) keeps each output's bytes together; its
integer-dot kernel scales and reduces lanes of 8 columns for every output, so its cost grows
with the activation rows almost as if each were a decode step of its own (Zen 3, 2 threads, a
4864 x 896 layer: 0.18 ms at one row, 0.63 ms at 8). ``kernels/cpu/panel5.h`` interleaves
16 outputs as the int4 panel does (``int4_panel.py``): one 32-bit lane is one output, the top
bit of ``u = q + 16`` sits in a plane of its own beside the nibbles, and Q5_0's scale applies
once per 32 columns for 16 outputs at once. The bytes are the row layout's, permuted
(:func:`to_panel5` / :func:`from_panel5`, exact inverses):

- ``plow`` uint8 ``[N / 16, K / 8, 64]``: the low nibbles of ``u``, ``int4_panel``'s
  ``qpanel`` of ``qlow``;
- ``phigh`` uint8 ``[N / 16, K / 32, 64]``: bit ``v`` of byte ``4 j + b`` of (tile ``t``,
  32-column group ``g``) is the top bit of ``u[16 t + j, 32 g + 4 v + b]``;
- ``pscales`` fp16 ``[N / 16, K / 32, 16]``.

:class:`PanelInt5LinearMethod` holds a native Q5_0 layer so (``load_native_gguf`` converts it
once its rows are filled, before the cache write; ``int4_panel.adopt_panel`` picks the layers)
and computes up to ``kernels.CPU_MAX_ROWS`` rows with ``kernels.cpu.int5_panel_a8`` (batch
invariant); longer prompts take the row layout's prefill GEMM over the same values
(``kernels.cpu.int5_panel_dequantize``) and an fp32 engine's short exact rows
``kernels.cpu.int5_panel_f32`` (``PanelMixin._prompt``), as the one-level int4 panel does.
"""

from __future__ import annotations

import torch

from localchat.kernels.reference_int5 import unpack_int5

from .int4_panel import nibbles_from_panel, nibbles_to_panel
from .int5_layout import pack_int5
from .native_int5 import Int5LinearMethod
from .panel_method import ROWS, PanelMixin, from_tiles, to_tiles

_ROW_NAMES = ("qlow", "qhigh", "scales")
_PANEL_NAMES = ("plow", "phigh", "pscales")
_BITS = torch.arange(8, dtype=torch.uint8)


def _check(n: int, k: int) -> None:
    if n % ROWS or k % 128 or n <= 0 or k <= 0:
        raise ValueError(f"the int5 panel layout needs N % 16 == 0 and K % 128 == 0, got "
                         f"N={n}, K={k}")


def to_panel5(qlow: torch.Tensor, qhigh: torch.Tensor,
              scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Row-layout int5 (``qlow`` uint8 ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 8]``,
    ``scales`` fp16 ``[N, K // 32]``) -> ``(plow, phigh, pscales)`` (module docstring), new
    contiguous tensors holding the same bytes. The reference of the C++
    ``kernels.cpu.int5_to_panel``. Raises ``ValueError`` unless ``N % 16 == 0`` and
    ``K % 128 == 0``."""
    n, k = qlow.shape[0], qlow.shape[1] * 2
    _check(n, k)
    top = (unpack_int5(qlow, qhigh) >> 4).reshape(n, k // 32, 8, 4)  # [.., v, b]
    phigh = (top << _BITS.view(8, 1)).sum(-2, dtype=torch.uint8)  # [N, K / 32, 4]
    return (nibbles_to_panel(qlow), to_tiles(phigh.reshape(n, k // 8), n, 4),
            to_tiles(scales, n, 1))


def panel5_values(plow: torch.Tensor, phigh: torch.Tensor) -> torch.Tensor:
    """``u`` uint8 ``[N, K]`` (0..31) of panel tiles ``plow [T, K / 8, 64]``, ``phigh
    [T, K / 32, 64]`` (``N = 16 T``)."""
    low = nibbles_from_panel(plow)  # row-layout nibbles [N, K / 2]
    n, k = low.shape[0], low.shape[1] * 2
    low = torch.stack((low & 0x0F, low >> 4), -1).reshape(n, k)
    h = from_tiles(phigh, 4).reshape(n, k // 32, 1, 4)
    top = (h >> _BITS.view(8, 1)) & 1  # [N, K / 32, v, b]
    return low | (top.reshape(n, k) << 4)


def from_panel5(plow: torch.Tensor, phigh: torch.Tensor,
                pscales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of :func:`to_panel5`: ``(qlow, qhigh, scales)`` of the row layout, bit for
    bit."""
    qlow, qhigh = (torch.from_numpy(a) for a in pack_int5(panel5_values(plow, phigh).numpy()))
    return qlow, qhigh, from_tiles(pscales, 1)


def dequantize_panel5(plow, phigh, pscales) -> torch.Tensor:
    """Panel tiles -> fp32 ``[16 T, K]``: ``(u - 16) * d``, the row layout's
    ``reference_int5.dequantize_int5`` values bit for bit (``gguf.quants.dequantize``'s)."""
    q = panel5_values(plow, phigh).float() - 16.0
    n, k = q.shape
    d = from_tiles(pscales, 1).float()
    return (q.view(n, k // 32, 32) * d[..., None]).view(n, k)


def panel5_fits(layer) -> bool:
    """Whether ``layer`` (a native int5 layer, K % 128 == 0) has a shape the panel tiles:
    N % 16 == 0."""
    return layer.out_features % ROWS == 0 and layer.in_features % 128 == 0


class PanelInt5LinearMethod(PanelMixin, Int5LinearMethod):
    """A native Q5_0 layer in the panel layout (module docstring) once :meth:`to_panel` ran;
    before that (while its rows are filled) the row layout of ``Int5LinearMethod``.
    ``apply(layer, x [..., K])`` -> ``[..., N]`` in ``x.dtype`` through
    ``kernels.cpu.int5_panel_a8`` for up to ``kernels.CPU_MAX_ROWS`` rows, the row layout's
    prefill GEMM beyond (``PanelMixin._prompt``)."""

    _OP = "int5_panel_a8"
    _F32_OP = "int5_panel_f32"
    _PANEL_NAMES = _PANEL_NAMES

    def __init__(self, device) -> None:
        super().__init__(device)
        self.panel = False

    def to_panel(self, layer, convert: bool = True) -> None:
        """Replace the row-layout buffers by panel ones: converted (``convert``) or empty (to
        be mapped from a cache entry that holds them)."""
        n, k = layer.out_features, layer.in_features
        _check(n, k)
        t = n // ROWS
        tensors = [torch.empty(t, k // 8, 64, dtype=torch.uint8),
                   torch.empty(t, k // 32, 64, dtype=torch.uint8),
                   torch.empty(t, k // 32, ROWS, dtype=torch.float16)]
        from localchat.kernels import cpu  # (converting only where the kernels are built)

        self._install(layer, _ROW_NAMES, tensors, (lambda: cpu.int5_to_panel(
            *(layer._buffers[name] for name in _ROW_NAMES), *tensors)) if convert else None)

    def _rows_op(self, layer):
        return "int5_panel_dequantize", self._panel(layer)

    def _dequantize_tiles(self, *tiles: torch.Tensor) -> torch.Tensor:
        return dequantize_panel5(*tiles)
