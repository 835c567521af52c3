"""Bytes of a model's parts: weights per format, KV cache, one step's activations.

Weights are exact, counted from the parameter shapes of the Llama-family model that
``ModelConfig`` describes (the shapes ``engine/models/llama.py`` builds); quantized linears take
the bytes their ``engine/quant`` linear method reports (W8A16 int8: a scale per output channel;
W4A16 int4: a scale and a zero point per group of inputs; FP8 e4m3: an fp32 scale per output
channel; scales bf16 under the CPU packed kernels, fp32 elsewhere), so the plan and the loader
agree. Only the decoder linears (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``) are
quantized; embeddings, the LM head, norms and biases stay in the activation dtype. KV bytes
follow DESIGN.md section 4: ``2 x num_layers x num_kv_heads x head_dim x dtype_bytes`` per token.
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from .methods import make_linear_method
from .schemes import QuantScheme

INT4_GROUP_SIZE = 128  # floating checkpoints; GGUF sources use 32 (loader.default_group_size)
# Activation dtype name -> bytes per element.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Quantized formats, best quality first; the unquantized format (bf16 or fp32) precedes them.
QUANT_FORMATS = ("fp8", "int8", "int4")
# Logits are fp32; the sampler holds about this many more [rows, vocab] fp32 buffers
# (penalized copy, probabilities, a sorted copy for top-p/top-k).
_SAMPLER_COPIES = 3


def weight_bytes(config: ModelConfig, fmt: str, act_dtype: str | None = None,
                 device_type: str = "cpu", int4_group_size: int = INT4_GROUP_SIZE) -> int:
    """Exact bytes of the model's weights in format ``fmt`` on a ``device_type`` device.

    ``fmt`` is ``bf16``/``fp16``/``fp32`` (everything in that dtype) or ``fp8``/``int8``/
    ``int4`` (decoder linears quantized in the layout of ``engine/quant``'s linear methods:
    their ``weight_bytes``, so the plan and the loader agree; the rest in ``act_dtype``,
    default bf16). ``int4_group_size`` is the preferred int4 group (inputs per scale/zero; the
    loader uses 32 for GGUF sources). Raises ``ValueError`` for an unknown format.
    """
    if fmt in DTYPE_BYTES:
        act_dtype = fmt
    act = DTYPE_BYTES[act_dtype or "bf16"]
    dense = sum(math.prod(s) for s in _dense_shapes(config))
    total = dense * act
    for out_f, in_f in _linear_shapes(config):
        total += config.num_hidden_layers * _linear_bytes(
            out_f, in_f, fmt, act_dtype or "bf16", device_type, int4_group_size)
    return total


def kv_bytes(config: ModelConfig, tokens: int, act_dtype: str) -> int:
    """KV cache bytes for ``tokens`` tokens: ``2 x layers x kv_heads x head_dim x bytes``."""
    per_token = 2 * config.num_hidden_layers * config.num_kv_heads * config.head_dim
    return per_token * DTYPE_BYTES[act_dtype] * tokens


def activation_bytes(config: ModelConfig, *, context_len: int, max_num_seqs: int,
                     max_num_batched_tokens: int, act_dtype: str, logit_rows: int) -> int:
    """Peak per-step workspace (bytes): what one forward pass holds at once.

    ``T = min(max_num_batched_tokens, context_len x max_num_seqs)`` tokens of hidden state and
    residual ``[T, hidden]``; the larger of the attention part (``qkv [T, q + 2 kv]``, rotated
    q/k copies, the gathered K/V of one full-context sequence ``[2, context_len, kv]``, the
    output ``[T, q]``) and the MLP part (``gate_up [T, 2 I]`` plus ``silu(gate) * up`` temporaries
    ``[T, 2 I]``); fp32 logits ``[logit_rows, vocab]`` plus the sampler's copies; and the fp32
    RoPE table ``[context_len, head_dim]``.
    """
    a = DTYPE_BYTES[act_dtype]
    c = config
    t = min(max_num_batched_tokens, context_len * max_num_seqs)
    hidden = 2 * t * c.hidden_size * a
    attn = (t * (2 * c.q_size + 3 * c.kv_size) + 2 * context_len * c.kv_size) * a
    mlp = 4 * t * c.intermediate_size * a
    logits = logit_rows * c.vocab_size * 4 * (1 + _SAMPLER_COPIES)
    rope = context_len * c.head_dim * 4
    return hidden + max(attn, mlp) + logits + rope


# -- helpers ---------------------------------------------------------------------------------


def _linear_shapes(c: ModelConfig) -> list[tuple[int, int]]:
    """``(out_features, in_features)`` of one decoder layer's quantizable linears."""
    return [
        (c.q_size + 2 * c.kv_size, c.hidden_size),  # qkv_proj
        (c.hidden_size, c.q_size),  # o_proj
        (2 * c.intermediate_size, c.hidden_size),  # gate_up_proj
        (c.hidden_size, c.intermediate_size),  # down_proj
    ]


def _dense_shapes(c: ModelConfig) -> list[tuple[int, ...]]:
    """Shapes of every parameter kept in the activation dtype: embeddings, LM head (untied),
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


def _linear_bytes(out_f: int, in_f: int, fmt: str, act_dtype: str, device_type: str,
                  group_size: int) -> int:
    """Bytes of one ``[out_f, in_f]`` linear weight in ``fmt`` (scales and zeros included)."""
    if fmt in DTYPE_BYTES:
        return out_f * in_f * DTYPE_BYTES[fmt]
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")
    method = make_linear_method(QuantScheme(fmt), device_type, in_f, group_size)
    return method.weight_bytes(out_f, in_f, _TORCH_DTYPES[act_dtype])


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
