"""Bytes of a model's parts: weights per format, KV cache, one step's activations.

The one footprint model of the engine, in torch dtypes: the planner (``planner.py``), the
predicted-vs-measured report (``report.py``), the engine's KV pool sizing
(``LLMEngine.kv_bytes_per_token``) and the benchmarks all count with it.

Weights are exact, counted from the parameter shapes of the Llama-family model that
``ModelConfig`` describes (the shapes ``engine/models/llama.py`` builds); quantized linears take
the bytes their ``engine/quant`` linear method reports (W8A16 int8: a scale per output channel;
W4A16 int4: a scale and a zero point per group of inputs; FP8 e4m3: an fp32 scale per output
channel; scales bf16 under the CPU packed kernels, fp32 elsewhere), so the plan and the loader
agree. Only the decoder linears (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``) are
quantized; embeddings, the LM head, norms and biases stay in the float dtype. KV bytes:
``2 x num_layers x num_kv_heads x head_dim x dtype_bytes`` per token (the per-layer
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensors of ``engine/kv_cache``).
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from ..quant.methods import make_linear_method
from ..quant.schemes import QuantScheme, default_float_dtype

INT4_GROUP_SIZE = 128  # floating checkpoints; GGUF sources use 32 (loader.default_group_size)
# Logits are fp32; the sampler holds about this many more [rows, vocab] fp32 buffers
# (penalized copy, probabilities, a sorted copy for top-p/top-k).
_SAMPLER_COPIES = 3


def linear_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """``(out_features, in_features)`` of every quantizable projection of one decoder layer:
    fused ``qkv_proj``, ``o_proj``, fused ``gate_up_proj``, ``down_proj``."""
    h, i = config.hidden_size, config.intermediate_size
    return [(config.q_size + 2 * config.kv_size, h), (h, config.q_size), (2 * i, h), (h, i)]


def weight_bytes(
    model_config: ModelConfig, scheme: QuantScheme | str = QuantScheme.NONE,
    device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
    group_size: int = INT4_GROUP_SIZE,
) -> int:
    """Bytes the loaded model's weights occupy in memory under ``scheme`` on ``device``.

    Exactly what ``load_model`` allocates (the RoPE table and the KV cache not included):
    the decoder layers' projections in the scheme's layout after the device repack (scales in
    bf16 on CPU for the packed int8/int4 kernels, fp32 elsewhere; an int4 layer whose
    ``in_features`` no group size divides stays unquantized, ``pick_group_size``); the embedding,
    the LM head (unless tied), norms and biases in the float ``dtype`` (default: the device's
    unquantized format, :func:`default_float_dtype`). ``scheme`` is a ``QuantScheme`` or its
    name (``none``, ``fp8``, ``int8``, ``int4``); ``group_size`` is the preferred int4 group
    (inputs per scale; the loader uses 32 for GGUF sources). Counts the layout only: whether
    ``device`` offers the scheme is ``quant.resolve_scheme``'s question (the planner counts for
    devices this machine may not have). Raises ``ValueError`` for an unknown scheme name.
    """
    scheme = _as_scheme(scheme)
    dtype = dtype or default_float_dtype(device)
    dense = sum(math.prod(s) for s in _dense_shapes(model_config)) * dtype.itemsize
    per_layer = sum(
        make_linear_method(scheme, device, k, group_size).weight_bytes(n, k, dtype)
        for n, k in linear_shapes(model_config)
    )
    return dense + model_config.num_hidden_layers * per_layer


def kv_bytes(config: ModelConfig, tokens: int, dtype: torch.dtype) -> int:
    """KV cache bytes for ``tokens`` tokens in ``dtype``:
    ``tokens x 2 x num_layers x num_kv_heads x head_dim x dtype_bytes``."""
    per_token = 2 * config.num_hidden_layers * config.num_kv_heads * config.head_dim
    return per_token * dtype.itemsize * tokens


def activation_bytes(config: ModelConfig, *, context_len: int, max_num_seqs: int,
                     max_num_batched_tokens: int, dtype: torch.dtype, logit_rows: int) -> int:
    """Peak per-step workspace (bytes): what one forward pass holds at once.

    ``T = min(max_num_batched_tokens, context_len x max_num_seqs)`` tokens of hidden state and
    residual ``[T, hidden]``; the larger of the attention part (``qkv [T, q + 2 kv]``, rotated
    q/k copies, the gathered K/V of one full-context sequence ``[2, context_len, kv]``, the
    output ``[T, q]``) and the MLP part (``gate_up [T, 2 I]`` plus ``silu(gate) * up`` temporaries
    ``[T, 2 I]``), all in the activation ``dtype``; fp32 logits ``[logit_rows, vocab]`` plus the
    sampler's copies; and the fp32 RoPE table ``[context_len, head_dim]``.
    """
    a = dtype.itemsize
    c = config
    t = min(max_num_batched_tokens, context_len * max_num_seqs)
    hidden = 2 * t * c.hidden_size * a
    attn = (t * (2 * c.q_size + 3 * c.kv_size) + 2 * context_len * c.kv_size) * a
    mlp = 4 * t * c.intermediate_size * a
    logits = logit_rows * c.vocab_size * 4 * (1 + _SAMPLER_COPIES)
    rope = context_len * c.head_dim * 4
    return hidden + max(attn, mlp) + logits + rope


# -- helpers ---------------------------------------------------------------------------------


def _as_scheme(scheme: QuantScheme | str) -> QuantScheme:
    if isinstance(scheme, QuantScheme):
        return scheme
    try:
        return QuantScheme(str(scheme).strip().lower())
    except ValueError:
        choices = ", ".join(s.value for s in QuantScheme)
        raise ValueError(f"unknown weight format {scheme!r} (choose from {choices})") from None


def _dense_shapes(c: ModelConfig) -> list[tuple[int, ...]]:
    """Shapes of every parameter kept in the float dtype: embeddings, LM head (untied),
    final norm, and per layer the two RMSNorm weights, the qkv bias, the q/k norms."""
    shapes: list[tuple[int, ...]] = [(c.vocab_size, c.hidden_size), (c.hidden_size,)]
    if not c.tie_word_embeddings:
        shapes.append((c.vocab_size, c.hidden_size))
    per_layer: list[tuple[int, ...]] = [(c.hidden_size,), (c.hidden_size,)]
    if c.attention_bias:
        per_layer.append((c.q_size + 2 * c.kv_size,))
    if c.qk_norm:
        per_layer += [(c.head_dim,), (c.head_dim,)]
    return shapes + per_layer * c.num_hidden_layers


__all__ = ["INT4_GROUP_SIZE", "activation_bytes", "kv_bytes", "linear_shapes", "weight_bytes"]
