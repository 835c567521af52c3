"""The panel layout of int4 weights (GGUF Q4_K, Q4_0, Q4_1) on CPUs with AVX-512 VNNI or
AVX2.

The row layout (``int4.py``'s k-scales: ``qweight [N, K // 2]``, ``scales`` / ``mins``
``[N, K // 32]`` uint8, ``super_scales [N, K // 256, 2]`` fp16) keeps each output's bytes
together. ``kernels/cpu/panel4.h`` interleaves 16 outputs instead, so one ``vpdpbusd`` lane is
one output and the scales apply once per 32 columns for 16 outputs at once: on a Zen 4 core
about 2.7x fewer cycles per weight at one activation row and 2.5x at 4-16 rows than the row
layout's kernel with the weights in L2; from DRAM (``scripts/bench_panel.py``) one row reads
at the bandwidth either way and 5 / 16 / 64 rows take 1.6-2.7x less time. The bytes are the
row layout's, permuted
(:func:`to_panel` / :func:`from_panel`, exact inverses):

- ``qpanel`` uint8 ``[N / 16, K / 8, 64]``: byte ``4 j + b`` of (tile ``t``, octet ``o``)
  holds ``w[16 t + j, 8 o + b]`` (low nibble) and ``w[16 t + j, 8 o + 4 + b]`` (high);
- ``pscales`` / ``pmins`` uint8 ``[N / 16, K / 32, 16]``; ``psuper`` fp16
  ``[N / 16, K / 256, 2, 16]`` (``d``, ``-dmin``); Q4_0 / Q4_1 (one level): fp16
  ``pscales`` / ``pmins``, no ``psuper``.

Q4_K layers take the integer-dot kernel for every row count, prompts included (llama.cpp's
design: Q8 activations for its K-quant prompts too). Q4_0 / Q4_1 ones take it for up to
``kernels.CPU_MAX_ROWS`` rows and run longer prompts as the row layout does, a bf16 GEMM over
weights dequantized from the panel tiles to the row layout's values
(``kernels.cpu.int4_panel_dequantize``): SmolLM2 (Q4_1)'s greedy answer to the README's
question turns on a 0.085-logit near-tie that int8 activations in its prompt would flip.

:class:`PanelInt4LinearMethod` holds a native Q4_K layer so (``load_native_gguf`` converts
the layers :func:`panel_kinds` allows once their rows are filled, before the cache write, so
cached loads map the panel tensors directly) and computes every row count with
``kernels.cpu.int4_panel_a8`` (batch invariant: a row's bits do not depend on the others).
``LOCALCHAT_CPU_PANEL=0`` keeps the row layout, ``=1`` takes the panel wherever the C++ kernels
are built (CPUs below AVX2 then run its portable kernel: for tests). On an AVX2 CPU
(``kernels/cpu/panel4_avx2.cpp``) the panel is taken by the fp32 engine that decodes through
the integer-dot kernels too (``LLMEngine.a8_fp32``), its Q4_K prompts then through them as
well (the same kernel for every row count: a prompt's KV does not depend on its chunking).
:func:`adopt_panel` also picks the Q6_K layers for the int6 panel layout (``int6_panel.py``),
the Q5_0 ones for the int5 layout (``int5_panel.py``) and the Q8_0 ones for the int8 layout
(``int8_panel.py``) under the same conditions, and :func:`panel_scheme` names the cache entry
of the set.
"""

from __future__ import annotations

import logging
import os

import torch

from .native import NativeInt4LinearMethod
from .panel_method import ROWS, PanelMixin

PANEL_ENV = "LOCALCHAT_CPU_PANEL"
logger = logging.getLogger(__name__)
_ROW_NAMES = ("qweight", "scales", "mins", "super_scales")
_PANEL_NAMES = ("qpanel", "pscales", "pmins", "psuper")


def _check(n: int, k: int, two_level: bool = True) -> None:
    unit = 256 if two_level else 32
    if n % ROWS or k % unit or n <= 0 or k <= 0:
        raise ValueError(f"the int4 panel layout needs N % 16 == 0 and K % {unit} == 0, got "
                         f"N={n}, K={k}")


def to_panel(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
             super_scales: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
    """Row-layout int4 (``qweight`` uint8 ``[N, K // 2]``; ``scales`` / ``mins``
    ``[N, K // 32]``, uint8 with ``super_scales`` fp16 ``[N, K // 256, 2]`` (Q4_K) or fp16
    without (Q4_0 / Q4_1)) -> ``(qpanel, pscales, pmins, psuper)`` (module docstring;
    ``psuper`` None for one level), new contiguous tensors holding the same bytes. The
    reference of the C++ ``kernels.cpu.int4_to_panel``. Raises ``ValueError`` unless
    ``N % 16 == 0`` and ``K`` is a multiple of 256 (two levels) or 32."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    _check(n, k, super_scales is not None)
    qpanel = nibbles_to_panel(qweight)
    ng = k // 32
    pscales, pmins = (s.reshape(n // ROWS, ROWS, ng).transpose(1, 2).contiguous()
                      for s in (scales, mins))
    psuper = None if super_scales is None else super_scales.reshape(
        n // ROWS, ROWS, k // 256, 2).permute(0, 2, 3, 1).contiguous()
    return qpanel.contiguous(), pscales, pmins, psuper


def from_panel(qpanel: torch.Tensor, pscales: torch.Tensor, pmins: torch.Tensor,
               psuper: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
    """The inverse of :func:`to_panel`: ``(qweight, scales, mins, super_scales)`` of the row
    layout, bit for bit (the reference side of the panel kernel's tests)."""
    t, o = qpanel.shape[0], qpanel.shape[1]
    n, k = t * ROWS, o * 8
    ng = k // 32
    scales, mins = (s.transpose(1, 2).reshape(n, ng).contiguous() for s in (pscales, pmins))
    sup = None if psuper is None else psuper.permute(0, 3, 1, 2).reshape(n, k // 256, 2) \
        .contiguous()
    return nibbles_from_panel(qpanel), scales, mins, sup


def nibbles_to_panel(qweight: torch.Tensor) -> torch.Tensor:
    """Row-layout nibbles ``qweight`` uint8 ``[N, K // 2]`` (byte ``i`` = columns ``2 i`` low,
    ``2 i + 1`` high) -> ``qpanel`` uint8 ``[N / 16, K / 8, 64]`` (module docstring), a new
    contiguous tensor (``N % 16 == 0``, ``K % 8 == 0``). Shared by the int6 panel's low
    nibbles (``int6_panel.py``)."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    b0, b1, b2, b3 = qweight.reshape(n, k // 8, 4).unbind(-1)
    lo = torch.tensor(0x0F, dtype=torch.uint8)
    hi = torch.tensor(0xF0, dtype=torch.uint8)
    p = torch.stack([(b0 & lo) | ((b2 & lo) << 4), (b0 >> 4) | (b2 & hi),
                     (b1 & lo) | ((b3 & lo) << 4), (b1 >> 4) | (b3 & hi)], -1)
    return p.reshape(n // ROWS, ROWS, k // 8, 4).transpose(1, 2) \
        .reshape(n // ROWS, k // 8, 64).contiguous()


def nibbles_from_panel(qpanel: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`nibbles_to_panel`: ``[N, K // 2]`` uint8, bit for bit."""
    t, o = qpanel.shape[0], qpanel.shape[1]
    n = t * ROWS
    p0, p1, p2, p3 = qpanel.reshape(t, o, ROWS, 4).transpose(1, 2).reshape(n, o, 4).unbind(-1)
    lo = torch.tensor(0x0F, dtype=torch.uint8)
    hi = torch.tensor(0xF0, dtype=torch.uint8)
    b = torch.stack([(p0 & lo) | ((p1 & lo) << 4), (p2 & lo) | ((p3 & lo) << 4),
                     (p0 >> 4) | (p1 & hi), (p2 >> 4) | (p3 & hi)], -1)
    return b.reshape(n, o * 4).contiguous()


KINDS = frozenset({"int4", "int5", "int6", "int8"})  # the panel layouts, by weight width


def vector_kinds() -> frozenset[str]:
    """The panel layouts whose own vector kernels run at the active ISA level (the others run
    portable code, many times slower than those vector kernels): all four at the AVX2 level
    and above (``panel{4,5,6,8}_avx2.cpp``, VNNI kernels for int4, int6 and int8; the int4 one
    1.6x the row layout's kernel at one row, 1.7-1.9x at 5-128 rows, the int5 one 1.25-1.3x at
    one row and 1.7-1.9x at 5-16, ``scripts/bench_panel.py``, Zen 3, 2 threads), none
    below."""
    from localchat.kernels import cpu

    return KINDS if cpu.active_isa() >= 1 else frozenset()


def fast_kinds() -> frozenset[str]:
    """The panel layouts taken by default: :func:`vector_kinds`, none on a CPU whose AMX the
    kernels use (its prefill GEMM reads the row layout), and not int5 where the active level
    is AVX-512 VNNI: there the row layout has a VNNI kernel and the int5 panel only its AVX2
    one, never measured against it."""
    from localchat.kernels import cpu

    if cpu.amx_enabled():
        return frozenset()
    kinds = vector_kinds()
    return kinds - {"int5"} if cpu.active_isa() >= 2 and cpu.has_vnni() else kinds


def _mode() -> str:
    """``LOCALCHAT_CPU_PANEL`` as ``"0"`` (0 / false / no / off), ``"1"`` (1 / true / yes /
    on) or ``""`` (anything else: the default), as ``LOCALCHAT_CPU_A8`` reads."""
    value = os.environ.get(PANEL_ENV, "").strip().lower()
    return "0" if value in ("0", "false", "no", "off") else \
        "1" if value in ("1", "true", "yes", "on") else ""


def panel_kinds(device: torch.device | str, dtype: torch.dtype,
                a8_fp32: bool = False) -> frozenset[str]:
    """The panel layouts (:data:`KINDS`) that native layers on ``device`` with activations of
    ``dtype`` take: none unless on the CPU with localchat's C++ kernels built and activations
    that take the integer-dot kernels (16-bit ones, ``kernels.cpu_a8_enabled``, or fp32 in an
    engine that decodes through them, ``a8_fp32``: ``LLMEngine.a8_fp32``; an fp32 engine asked
    for keeps the row layout's exact kernels); then, by default, :func:`fast_kinds`.
    ``LOCALCHAT_CPU_PANEL``: ``0`` none, ``1`` all wherever the kernels are built."""
    from localchat import kernels

    from .cpu_int4 import own_kernels

    mode = _mode()
    if mode == "0" or torch.device(device).type != "cpu" or not own_kernels():
        return frozenset()
    if dtype == torch.float32 and a8_fp32:
        if kernels._a8_mode() == "never":
            return frozenset()
    elif dtype not in (torch.bfloat16, torch.float16) or not kernels.cpu_a8_enabled(dtype):
        return frozenset()
    return KINDS if mode == "1" else fast_kinds()


def panel_fits(layer) -> bool:
    """Whether ``layer`` (a native int4 layer: Q4_K's two levels, or Q4_0 / Q4_1's fp16
    scales) has a shape the panel tiles: N % 16 == 0, K % 256 == 0 (two levels) or 32."""
    two = layer._buffers.get("super_scales") is not None
    return layer.out_features % ROWS == 0 and layer.in_features % (256 if two else 32) == 0


class PanelInt4LinearMethod(PanelMixin, NativeInt4LinearMethod):
    """A native int4 layer (Q4_K's two levels: ``scale_dtype`` uint8; Q4_0 / Q4_1: fp16) in
    the panel layout (module docstring) once :meth:`to_panel` ran; before that (while its rows
    are filled) the row layout of ``NativeInt4LinearMethod``. ``apply(layer, x [..., K])`` ->
    ``[..., N]`` in ``x.dtype`` through ``kernels.cpu.int4_panel_a8``: for any number of rows
    (Q4_K), or up to ``kernels.CPU_MAX_ROWS`` (one level: longer prompts take the row layout's
    prefill GEMM over the same dequantized values, ``PanelMixin._prompt``)."""

    _OP = "int4_panel_a8"

    def __init__(self, device, scale_dtype: torch.dtype = torch.uint8) -> None:
        super().__init__(device, "packed", False, scale_dtype)
        self.panel = False

    def _panel_names(self) -> tuple[str, ...]:
        return self._names()[1]

    def _names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        two = self.scale_dtype == torch.uint8
        return (_ROW_NAMES, _PANEL_NAMES) if two else (_ROW_NAMES[:3], _PANEL_NAMES[:3])

    def to_panel(self, layer, convert: bool = True) -> None:
        """Replace the row-layout buffers by panel ones: converted (``convert``) or empty (to
        be mapped from a cache entry that holds them)."""
        n, k = layer.out_features, layer.in_features
        two = self.scale_dtype == torch.uint8
        _check(n, k, two)
        t, sdt = n // ROWS, self.scale_dtype
        tensors = [torch.empty(t, k // 8, 64, dtype=torch.uint8),
                   torch.empty(t, k // 32, ROWS, dtype=sdt),
                   torch.empty(t, k // 32, ROWS, dtype=sdt)]
        if two:
            tensors.append(torch.empty(t, k // 256, 2, ROWS, dtype=torch.float16))
        from localchat.kernels import cpu  # (converting only where the kernels are built)

        src = [layer._buffers.get(name) for name in _ROW_NAMES]  # super None: one level
        self._install(layer, self._names()[0], tensors, (lambda: cpu.int4_to_panel(
            *src, *tensors, *[None] * (4 - len(tensors)))) if convert else None)

    _F32_OP = "int4_panel_f32"

    def _rows_op(self, layer):
        if self.scale_dtype == torch.uint8:  # Q4_K: the integer-dot kernel, as llama.cpp's
            return None
        return "int4_panel_dequantize", self._panel(layer)[:3]

    def _panel(self, layer) -> tuple[torch.Tensor | None, ...]:
        """``(qpanel, pscales, pmins, psuper)``, ``psuper`` None for one level."""
        found = [layer._buffers[name] for name in self._names()[1]]
        return (*found, None) if len(found) == 3 else tuple(found)

    def process_weights_after_loading(self, layer):
        if not self.panel:
            super().process_weights_after_loading(layer)

    def embed(self, layer, ids, dtype):
        raise NotImplementedError("a panel-layout layer is never an embedding")


def adopt_panel(model, device: torch.device | str, dtype: torch.dtype, head=None,
                a8_fp32: bool = False) -> list:
    """Swap a panel method in for every native linear layer of ``model`` (after
    ``create_weights``; shard modules of a sharded layer included) that may hold a panel
    layout of a kind :func:`panel_kinds` allows (``a8_fp32`` as there) and fits
    (:func:`panel_fits`): :class:`PanelInt4LinearMethod` for Q4_K, Q4_0 and Q4_1 layers, not
    the embedding (its rows are gathered) nor ``head`` (the greedy head reads the output
    layer's rows); ``int6_panel.PanelInt6LinearMethod`` for Q6_K layers, ``int5_panel.
    PanelInt5LinearMethod`` for Q5_0 ones and ``int8_panel.PanelInt8LinearMethod`` for Q8_0
    ones, ``head`` included (they read rows back from the panel), a pure embedding not.
    Returns those modules, still in the row layout for their rows to be filled."""
    kinds = panel_kinds(device, dtype, a8_fp32)
    if not kinds:
        return []
    from .int5_panel import PanelInt5LinearMethod, panel5_fits
    from .int6_panel import PanelInt6LinearMethod, panel6_fits
    from .int8_panel import PanelInt8LinearMethod, panel8_fits
    from .native_int5 import Int5LinearMethod
    from .native_int6 import Int6LinearMethod

    scale_kinds = (torch.uint8, torch.float16)  # Q4_K's two levels, Q4_0 / Q4_1's fp16 scales
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    adopted = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if type(method) is NativeInt4LinearMethod:
            if ("int4" in kinds and method.scale_dtype in scale_kinds
                    and method.kernel == "packed" and module is not head
                    and panel_fits(module)):
                module.quant_method = PanelInt4LinearMethod(device, method.scale_dtype)
                adopted.append(module)
        elif method is None or not (module is head or module is not embedding):
            continue
        elif type(method) is Int6LinearMethod:
            if "int6" in kinds and panel6_fits(module):
                module.quant_method = PanelInt6LinearMethod(device)
                adopted.append(module)
        elif type(method) is Int5LinearMethod:
            if "int5" in kinds and panel5_fits(module):
                module.quant_method = PanelInt5LinearMethod(device)
                adopted.append(module)
        elif "int8" in kinds and panel8_fits(module):
            module.quant_method = PanelInt8LinearMethod(device)
            adopted.append(module)
    slow = {_kind(m.quant_method) for m in adopted} - vector_kinds()
    if slow:  # LOCALCHAT_CPU_PANEL=1 where they are portable
        logger.warning("%s=1 without the %s panel kernels at the active ISA level: they run "
                       "portable code, many times slower than their vector kernels (a testing "
                       "switch; unset it)", PANEL_ENV, " / ".join(sorted(slow)))
    return adopted


def _kind(method) -> str:
    """``"int4"``, ``"int5"``, ``"int6"`` or ``"int8"``: the panel layout of a panel method."""
    from .int5_panel import PanelInt5LinearMethod
    from .int6_panel import PanelInt6LinearMethod

    if isinstance(method, PanelInt4LinearMethod):
        return "int4"
    if isinstance(method, PanelInt5LinearMethod):
        return "int5"
    return "int6" if isinstance(method, PanelInt6LinearMethod) else "int8"


def panel_scheme(adopted: list) -> str:
    """The cache scheme name of a native load whose panel layers are ``adopted``: ``native``
    (none), ``native-panel`` (Q4_K layers), ``-q6`` added where Q6_K layers are among them,
    ``-q8`` where Q8_0 ones are, ``-all`` where Q4_0 / Q4_1 ones are, ``-q5`` where Q5_0
    ones are, so that a model's entries with and without panels (``LOCALCHAT_CPU_PANEL``) are
    two entries rather than one rebuilt at each switch."""
    if not adopted:
        return "native"
    from .int5_panel import PanelInt5LinearMethod
    from .int6_panel import PanelInt6LinearMethod
    from .int8_panel import PanelInt8LinearMethod

    methods = [layer.quant_method for layer in adopted]
    int5 = any(isinstance(m, PanelInt5LinearMethod) for m in methods)
    int6 = any(isinstance(m, PanelInt6LinearMethod) for m in methods)
    int8 = any(isinstance(m, PanelInt8LinearMethod) for m in methods)
    one_level = any(isinstance(m, PanelInt4LinearMethod) and m.scale_dtype != torch.uint8
                    for m in methods)
    return "native-panel" + ("-q6" if int6 else "") + ("-q8" if int8 else "") + \
        ("-all" if one_level else "") + ("-q5" if int5 else "")
