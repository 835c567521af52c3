"""The panel layout of int6 weights (GGUF Q6_K) on CPUs with AVX-512 VNNI.

The int6 row layout (``int6_layout.py``, ``native_int6.py``: ``qlow [N, K // 2]``, ``qhigh
[N, K // 4]``, ``scales [N, K // 16]`` int8, ``super_scales [N, K // 256]`` fp16) keeps each
output's bytes together; its integer-dot kernel scales and reduces every lane of every
output. ``kernels/cpu/panel6.h`` interleaves 16 outputs as the int4 panel does
(``int4_panel.py``): one ``vpdpbusd`` lane is one output, the top two bits of ``u = q + 32``
sit in a plane of their own beside the nibbles, and the sub-block scales multiply exact int32
dots for 16 outputs at once. The bytes are the row layout's, permuted (:func:`to_panel6` /
:func:`from_panel6`, exact inverses):

- ``plow`` uint8 ``[N / 16, K / 8, 64]``: the low nibbles of ``u``, ``int4_panel``'s
  ``qpanel`` of ``qlow``;
- ``phigh`` uint8 ``[N / 16, K / 16, 64]``: byte ``4 j + b`` of (tile ``t``, 16-column
  sub-block ``s``) holds the top two bits of ``u[16 t + j, 16 s + 4 q + b]`` at bits
  ``2 q, 2 q + 1`` (``q = 0..3``);
- ``pscales`` int8 ``[N / 16, K / 16, 16]``; ``psuper`` fp16 ``[N / 16, K / 256, 16]``.

:class:`PanelInt6LinearMethod` holds a native Q6_K layer so (``load_native_gguf`` converts it
once its rows are filled, before the cache write; ``int4_panel.adopt_panel`` picks the layers)
and computes every row count with ``kernels.cpu.int6_panel_a8`` (batch invariant); rows read
back (the embedding's lookup where a tied embedding is the output layer, the greedy head's
rescoring) dequantize from the panel directly, equal to the row layout's values bit for bit.
"""

from __future__ import annotations

import torch

from localchat.kernels import reference

from .int4_panel import nibbles_from_panel, nibbles_to_panel
from .int6_layout import pack_int6
from .native_int6 import Int6LinearMethod
from .panel_method import ROWS, PanelMixin, from_tiles, to_tiles

_ROW_NAMES = ("qlow", "qhigh", "scales", "super_scales")
_PANEL_NAMES = ("plow", "phigh", "pscales", "psuper")
_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)


def _check(n: int, k: int) -> None:
    if n % ROWS or k % 256 or n <= 0 or k <= 0:
        raise ValueError(f"the int6 panel layout needs N % 16 == 0 and K % 256 == 0, got "
                         f"N={n}, K={k}")


def to_panel6(qlow: torch.Tensor, qhigh: torch.Tensor, scales: torch.Tensor,
              super_scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Row-layout int6 (``qlow`` uint8 ``[N, K // 2]``, ``qhigh`` uint8 ``[N, K // 4]``,
    ``scales`` int8 ``[N, K // 16]``, ``super_scales`` fp16 ``[N, K // 256]``) ->
    ``(plow, phigh, pscales, psuper)`` (module docstring), new contiguous tensors holding the
    same bytes. The reference of the C++ ``kernels.cpu.int6_to_panel``. Raises
    ``ValueError`` unless ``N % 16 == 0`` and ``K % 256 == 0``."""
    n, k = qlow.shape[0], qlow.shape[1] * 2
    _check(n, k)
    top = (reference.unpack_int6(qlow, qhigh) >> 4).reshape(n, k // 16, 4, 4)  # [.., q, b]
    phigh = (top << _SHIFTS.view(4, 1)).sum(-2, dtype=torch.uint8)  # [N, K / 16, 4]
    return (nibbles_to_panel(qlow), to_tiles(phigh.reshape(n, k // 4), n, 4),
            to_tiles(scales, n, 1), to_tiles(super_scales, n, 1))


def panel6_values(plow: torch.Tensor, phigh: torch.Tensor) -> torch.Tensor:
    """``u`` uint8 ``[N, K]`` (0..63) of panel tiles ``plow [T, K / 8, 64]``, ``phigh
    [T, K / 16, 64]`` (``N = 16 T``)."""
    low = nibbles_from_panel(plow)  # row-layout nibbles [N, K / 2]
    n, k = low.shape[0], low.shape[1] * 2
    low = torch.stack((low & 0x0F, low >> 4), -1).reshape(n, k)
    h = from_tiles(phigh, 4).reshape(n, k // 16, 1, 4)
    top = (h >> _SHIFTS.view(4, 1)) & 3  # [N, K / 16, q, b]
    return low | (top.reshape(n, k) << 4)


def from_panel6(plow: torch.Tensor, phigh: torch.Tensor, pscales: torch.Tensor,
                psuper: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inverse of :func:`to_panel6`: ``(qlow, qhigh, scales, super_scales)`` of the row
    layout, bit for bit."""
    u = panel6_values(plow, phigh)
    qlow, qhigh = (torch.from_numpy(a) for a in pack_int6(u.numpy()))
    return qlow, qhigh, from_tiles(pscales, 1), from_tiles(psuper, 1)


def dequantize_panel6(plow, phigh, pscales, psuper) -> torch.Tensor:
    """Panel tiles -> fp32 ``[16 T, K]``: ``(u - 32) * (d * sc)``, the row layout's
    ``reference.dequantize_int6`` values bit for bit (``gguf.quants.dequantize``'s)."""
    q = panel6_values(plow, phigh).float() - 32.0
    n, k = q.shape
    sd = reference.int6_scales(from_tiles(pscales, 1), from_tiles(psuper, 1))
    return (q.view(n, k // 16, 16) * sd[..., None]).view(n, k)


def panel6_fits(layer) -> bool:
    """Whether ``layer`` (a native int6 layer) has a shape the panel tiles: N % 16 == 0 (K
    is a multiple of 256 for every int6 layer)."""
    return layer.out_features % ROWS == 0 and layer.in_features % 256 == 0


class PanelInt6LinearMethod(PanelMixin, Int6LinearMethod):
    """A native Q6_K layer in the panel layout (module docstring) once :meth:`to_panel` ran;
    before that (while its rows are filled) the row layout of ``Int6LinearMethod``.
    ``apply(layer, x [..., K])`` -> ``[..., N]`` in ``x.dtype`` through
    ``kernels.cpu.int6_panel_a8`` for any number of rows."""

    _OP = "int6_panel_a8"
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
                   torch.empty(t, k // 16, 64, dtype=torch.uint8),
                   torch.empty(t, k // 16, ROWS, dtype=torch.int8),
                   torch.empty(t, k // 256, ROWS, dtype=torch.float16)]
        from localchat.kernels import cpu  # (converting only where the kernels are built)

        self._install(layer, _ROW_NAMES, tensors, (lambda: cpu.int6_to_panel(
            *(layer._buffers[name] for name in _ROW_NAMES), *tensors)) if convert else None)

    def _gather_op(self, layer):
        return "int6_panel_gather", self._panel(layer)

    def _dequantize_tiles(self, *tiles: torch.Tensor) -> torch.Tensor:
        return dequantize_panel6(*tiles)
