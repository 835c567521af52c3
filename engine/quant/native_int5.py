"""The ``native`` format's Q5_0 layers: GGUF Q5_0 held exactly at the file's size (int5).

Layout (``localchat.engine.quant.int5_layout``, ``kernels/cpu/qa5.h``): ``qlow`` uint8
``[N, K // 2]`` (low 4 bits of ``u = q + 16``), ``qhigh`` uint8 ``[N, K // 8]`` (the top bit,
a 64-bit mask per 64 columns), ``scales`` fp16 ``[N, K // 32]``; ``w = (u - 16) * d``: 22 bytes
per 32 weights, as in the file (the group-wise int8 layout Q5_0 otherwise repacks onto holds
34 with its fp16 scales).

Only localchat's C++ CPU kernels read it (:func:`int5_usable`), so the layer takes it only on
CPU where they are built, and only for ``K % 128 == 0`` (``loader/native._layout_of``);
elsewhere Q5_0 keeps the int8 layout (``native.INT5_AS_INT8``). ``LOCALCHAT_CPU_INT5=0`` keeps
int8 on CPU too (an A/B switch for benchmarks; read per load). Compute: up to
``CPU_MAX_ROWS`` rows ``cpu.int5_matmul_a8`` (integer dots on int8 activations, where
``kernels.cpu_a8_enabled``: 16-bit activations by default) or the exact fp32-activation
``cpu.int5_matmul``, both batch invariant; more rows (prefill) row blocks dequantized by
``cpu.int5_dequantize`` for ``torch.mm`` (``cpu_prefill.blockwise_mm``, bf16 for bf16
activations). Reference design: llama.cpp keeps Q5_0 tensors in their block format and dots
them with Q8_0 activations (``ggml_vec_dot_q5_0_q8_0``).
"""

from __future__ import annotations

import os

import torch

from localchat.kernels import cpu

from .methods import _set_buffer
from .planar import PlanarLinearMethod

INT5_ENV = "LOCALCHAT_CPU_INT5"


def int5_usable(device: torch.device | str) -> bool:
    """Whether a Q5_0 layer on ``device`` can hold the int5 layout: CPU with localchat's C++
    kernels built (not ``LOCALCHAT_KERNELS=reference``, not ``LOCALCHAT_CPU_INT4=int4pack``)
    and ``LOCALCHAT_CPU_INT5`` not ``0``."""
    from .cpu_int4 import own_kernels

    if os.environ.get(INT5_ENV, "").strip() == "0":
        return False
    return torch.device(device).type == "cpu" and own_kernels()


def int5_weight_bytes(out_features: int, in_features: int) -> int:
    """Bytes of one int5 weight ``[N, K]``: 22 per 32 weights (``qlow`` K/2, ``qhigh`` K/8,
    fp16 ``d`` per 32, per row)."""
    n, k = out_features, in_features
    return n * (k // 2 + k // 8 + 2 * (k // 32))


class Int5LinearMethod(PlanarLinearMethod):
    """GGUF Q5_0 weights in the int5 layout (module docstring); ``apply(layer, x [..., K])``
    -> ``[..., N]`` in ``x.dtype`` (fp32 accumulation); ``embed`` dequantizes the rows read.
    ``create_weights`` raises ``ValueError`` unless ``in_features % 128 == 0``."""

    def create_weights(self, layer, device):
        n, k = layer.out_features, layer.in_features
        if k % 128:
            raise ValueError(f"int5 needs in_features % 128 == 0, got {k}")
        layer.weight = None
        _set_buffer(layer, "qlow", torch.empty(n, k // 2, dtype=torch.uint8, device=device))
        _set_buffer(layer, "qhigh", torch.empty(n, k // 8, dtype=torch.uint8, device=device))
        _set_buffer(layer, "scales", torch.empty(n, k // 32, dtype=torch.float16,
                                                 device=device))

    def _weights(self, layer):
        return layer.qlow, layer.qhigh, layer.scales

    _matmul_a8 = staticmethod(cpu.int5_matmul_a8)
    _matmul = staticmethod(cpu.int5_matmul)
    _dequantize = staticmethod(cpu.int5_dequantize)
    _dequant_mm = staticmethod(cpu.int5_dequant_mm)

    def weight_bytes(self, out_features, in_features, dtype):
        return int5_weight_bytes(out_features, in_features)


def repack_int5_rows(layer, raw, shape: tuple[int, int], start: int, end: int,
                     source_rows: torch.Tensor | None, tensor_name: str) -> None:
    """Repack GGUF Q5_0 bytes ``raw`` (``shape [end - start, K]``) into rows ``[start, end)``
    of an int5 ``layer`` with the C++ op (``source_rows``: optional row permutation).

    Raises ``ValueError`` on a shape mismatch, ``ModelLoadError`` on a wrong byte count."""
    from .gguf_repack import _checked_bytes, _raw_tensor

    n, k = shape
    if n != end - start or k != layer.in_features:
        raise ValueError(f"shape mismatch: checkpoint {[n, k]}, model "
                         f"{[end - start, layer.in_features]}")
    raw = _checked_bytes(raw, 6, shape, tensor_name)
    cpu.gguf_repack_q5(_raw_tensor(raw), layer.qlow[start:end], layer.qhigh[start:end],
                       layer.scales[start:end], source_rows)
