"""The ``native`` format's Q6_K layers: GGUF Q6_K held exactly at the file's size (int6).

Layout (``localchat.engine.quant.int6_layout``, ``kernels/cpu/qa6.h``): ``qlow`` uint8
``[N, K // 2]`` (low 4 bits of ``u = q + 32``), ``qhigh`` uint8 ``[N, K // 4]`` (top 2 bits),
``scales`` int8 ``[N, K // 16]``, ``super_scales`` fp16 ``[N, K // 256]``;
``w = (u - 32) * (d * sc)``: 210 bytes per 256 weights, as in the file (the group-wise int8
layout Q6_K otherwise repacks onto holds 320 with its fp32 scales).

Only localchat's C++ CPU kernels read it (:func:`int6_usable`), so the layer takes it only on
CPU where they are built; elsewhere Q6_K keeps the int8 layout. Compute: up to
``CPU_MAX_ROWS`` rows ``cpu.int6_matmul_a8`` (integer dots on int8 activations, where
``kernels.cpu_a8_enabled``: 16-bit activations by default) or the exact fp32-activation
``cpu.int6_matmul``, both batch invariant; more rows (prefill) row blocks dequantized by
``cpu.int6_dequantize`` for ``torch.mm`` (``cpu_prefill.blockwise_mm``, bf16 for bf16
activations). Reference design: llama.cpp keeps Q6_K tensors in their block format and dots
them with Q8 activations (``ggml_vec_dot_q6_K_q8_K``).
"""

from __future__ import annotations

import torch

from localchat.kernels import cpu

from .methods import _set_buffer
from .planar import PlanarLinearMethod


def int6_usable(device: torch.device | str) -> bool:
    """Whether a Q6_K layer on ``device`` can hold the int6 layout: CPU with localchat's C++
    kernels built (not ``LOCALCHAT_KERNELS=reference``, not ``LOCALCHAT_CPU_INT4=int4pack``)."""
    from .cpu_int4 import own_kernels

    return torch.device(device).type == "cpu" and own_kernels()


def int6_weight_bytes(out_features: int, in_features: int) -> int:
    """Bytes of one int6 weight ``[N, K]``: 210 per 256 weights (``qlow`` K/2, ``qhigh`` K/4,
    int8 scale per 16, fp16 ``d`` per 256, per row)."""
    n, k = out_features, in_features
    return n * (k // 2 + k // 4 + k // 16 + 2 * (k // 256))


class Int6LinearMethod(PlanarLinearMethod):
    """GGUF Q6_K weights in the int6 layout (module docstring); ``apply(layer, x [..., K])``
    -> ``[..., N]`` in ``x.dtype`` (fp32 accumulation); ``embed`` dequantizes the rows read."""

    def create_weights(self, layer, device):
        n, k = layer.out_features, layer.in_features
        if k % 256:
            raise ValueError(f"int6 needs in_features % 256 == 0, got {k}")
        layer.weight = None
        _set_buffer(layer, "qlow", torch.empty(n, k // 2, dtype=torch.uint8, device=device))
        _set_buffer(layer, "qhigh", torch.empty(n, k // 4, dtype=torch.uint8, device=device))
        _set_buffer(layer, "scales", torch.empty(n, k // 16, dtype=torch.int8, device=device))
        _set_buffer(layer, "super_scales", torch.empty(n, k // 256, dtype=torch.float16,
                                                       device=device))

    def _weights(self, layer):
        return layer.qlow, layer.qhigh, layer.scales, layer.super_scales

    _matmul_a8 = staticmethod(cpu.int6_matmul_a8)
    _matmul = staticmethod(cpu.int6_matmul)
    _dequantize = staticmethod(cpu.int6_dequantize)
    _dequant_mm = staticmethod(cpu.int6_dequant_mm)

    def weight_bytes(self, out_features, in_features, dtype):
        return int6_weight_bytes(out_features, in_features)


def repack_int6_rows(layer, raw, shape: tuple[int, int], start: int, end: int,
                     source_rows: torch.Tensor | None, tensor_name: str) -> None:
    """Repack GGUF Q6_K bytes ``raw`` (``shape [end - start, K]``) into rows ``[start, end)``
    of an int6 ``layer`` with the C++ op (``source_rows``: optional row permutation).

    Raises ``ValueError`` on a shape mismatch, ``ModelLoadError`` on a wrong byte count."""
    from .gguf_repack import _checked_bytes, _raw_tensor

    n, k = shape
    if n != end - start or k != layer.in_features:
        raise ValueError(f"shape mismatch: checkpoint {[n, k]}, model "
                         f"{[end - start, layer.in_features]}")
    raw = _checked_bytes(raw, 14, shape, tensor_name)
    cpu.gguf_repack_q6(_raw_tensor(raw), layer.qlow[start:end], layer.qhigh[start:end],
                       layer.scales[start:end], layer.super_scales[start:end], source_rows)
