"""Exact weight bytes of a Llama-family model per weight format (for the memory planner)."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .methods import make_linear_method
from .schemes import QuantScheme, default_float_dtype, resolve_scheme


def linear_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """``(out_features, in_features)`` of every quantizable projection of one decoder layer:
    fused ``qkv_proj``, ``o_proj``, fused ``gate_up_proj``, ``down_proj``."""
    h, i = config.hidden_size, config.intermediate_size
    return [(config.q_size + 2 * config.kv_size, h), (h, config.q_size), (2 * i, h), (h, i)]


def weight_bytes(
    model_config: ModelConfig, scheme: QuantScheme | str, device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None, group_size: int = 128,
) -> int:
    """Bytes the loaded model's weights occupy in memory under ``scheme`` on ``device``.

    Exactly what ``load_model`` allocates (the RoPE table and the KV cache not included):
    the decoder layers' projections in the scheme's layout after the device repack (scales in
    bf16 on CPU for the packed int8/int4 kernels, fp32 elsewhere; int4 layers whose
    ``in_features`` no group of 128/64/32 divides stay unquantized); the embedding, the LM
    head (unless tied), norms and biases in the float ``dtype`` (default: the device's
    unquantized format, :func:`default_float_dtype`). Raises ``ValueError`` for a scheme the
    device does not offer.
    """
    scheme = resolve_scheme(scheme, device)
    dtype = dtype or default_float_dtype(device)
    fb = dtype.itemsize
    c = model_config
    total = c.vocab_size * c.hidden_size * fb  # embed_tokens
    if not c.tie_word_embeddings:
        total += c.vocab_size * c.hidden_size * fb  # lm_head
    total += c.hidden_size * fb  # final norm
    per_layer = 2 * c.hidden_size * fb  # input / post-attention norms
    if c.qk_norm:
        per_layer += 2 * c.head_dim * fb
    if c.attention_bias:
        per_layer += (c.q_size + 2 * c.kv_size) * fb
    for n, k in linear_shapes(c):
        method = make_linear_method(scheme, device, k, group_size)
        per_layer += method.weight_bytes(n, k, dtype)
    return total + c.num_hidden_layers * per_layer
