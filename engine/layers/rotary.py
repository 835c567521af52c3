"""Rotary position embedding (Su et al. 2021, arXiv 2104.09864), neox layout.

Supports the plain RoPE, ``linear`` position interpolation and Llama 3's ``llama3`` frequency
scaling (the HF ``rope_scaling`` dict; the same maths as transformers'
``_compute_llama3_parameters``). Other scaling types raise ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from localchat import kernels


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` fp32 for the given scaling (see module doc)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not rope_scaling:
        return inv_freq
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if kind == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        old_ctx = float(rope_scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Holds ``cos_sin_cache [max_position, head_dim]`` fp32 and rotates q/k by position.

    ``forward(positions [num_tokens], q [num_tokens, num_heads, head_dim],
    k [num_tokens, num_kv_heads, head_dim]) -> (q, k)``.
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        rope_scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if torch.get_default_device().type == "meta":
            # Meta-device construction (the loader refills this buffer afterwards): computing
            # the table through meta kernels would import torch._dynamo (~2 s) for nothing.
            cache = torch.empty(max_position, head_dim, dtype=torch.float32)
            self.register_buffer("cos_sin_cache", cache, persistent=False)
            return
        inv_freq = rope_inv_freq(head_dim, base, rope_scaling)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return kernels.apply_rope(positions, q, k, self.cos_sin_cache)
