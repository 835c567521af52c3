"""The memory planner: weights + KV cache + draft + activations + runtime, per weight format.

``plan_memory`` predicts, before anything is downloaded or allocated, how many bytes a model
needs on a device in each weight format, and picks the highest-quality format that fits the
budget (unquantized bf16/fp32 > fp8 > int8 > int4). When none fits at the requested context it
lowers the context (never below ``MIN_CONTEXT_LEN`` tokens); when still nothing fits it raises
``MemoryPlanError`` with the numbers. Every figure is in bytes.

Weight bytes are exact, counted from the parameter shapes of the Llama-family model that
``ModelConfig`` describes (the same shapes ``engine/models/llama.py`` builds); quantized linears
take the bytes their ``engine/quant`` linear method reports (W8A16 int8: a scale per output
channel; W4A16 int4: a scale and a zero point per group of 128 inputs; FP8 e4m3: an fp32 scale
per output channel; scales bf16 under the CPU packed kernels, fp32 elsewhere). Only the decoder
linears (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``) are quantized; embeddings,
the LM head, norms and biases stay in the activation dtype. KV bytes follow DESIGN.md section 4:
``2 x num_layers x num_kv_heads x head_dim x dtype_bytes`` per token. Reference designs: vLLM's
``determine_num_available_blocks`` (profile-then-size) and llama.cpp's ``--fit`` planning.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from ..config import ModelConfig
from ..errors import LocalchatError
from .memory_budget import DeviceSpec
from .methods import make_linear_method
from .schemes import QuantScheme

MIN_CONTEXT_LEN = 2048
INT4_GROUP_SIZE = 128  # floating checkpoints; GGUF sources use 32 (loader.default_group_size)
# Activation dtype name -> bytes per element.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Quantized formats, best quality first; the unquantized format (bf16 or fp32) precedes them.
QUANT_FORMATS = ("fp8", "int8", "int4")
# Logits are fp32; the sampler holds about this many more [rows, vocab] fp32 buffers
# (penalized copy, probabilities, a sorted copy for top-p/top-k).
_SAMPLER_COPIES = 3


class MemoryPlanError(LocalchatError):
    """No weight format fits the budget, even at ``MIN_CONTEXT_LEN`` tokens of context."""


@dataclass(frozen=True)
class PlanRow:
    """One weight format's prediction (bytes) at ``context_len`` tokens per sequence.

    ``total_bytes`` is the sum of the parts; ``margin_bytes = budget - total`` (negative:
    does not fit). ``draft_*`` are 0 without a draft model.
    """

    format: str
    context_len: int
    weight_bytes: int
    kv_bytes: int
    draft_weight_bytes: int
    draft_kv_bytes: int
    activation_bytes: int
    overhead_bytes: int
    total_bytes: int
    margin_bytes: int

    @property
    def fits(self) -> bool:
        return self.margin_bytes >= 0


@dataclass(frozen=True)
class MemoryPlan:
    """The plan: one ``PlanRow`` per format at the requested context, and the choice.

    ``choice`` is the chosen row (its ``context_len`` is lower than ``requested_context_len``
    when the context had to shrink; ``note`` then says so). ``formats`` are in quality order.
    """

    device: DeviceSpec
    budget_bytes: int
    requested_context_len: int
    max_num_seqs: int
    rows: tuple[PlanRow, ...]
    choice: PlanRow
    forced: bool = False
    note: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def format(self) -> str:
        return self.choice.format

    @property
    def context_len(self) -> int:
        return self.choice.context_len

    def to_dict(self) -> dict:
        """A JSON-ready dict (``localchat plan --json``): bytes as integers."""
        return {
            "device": asdict(self.device),
            "budget_bytes": self.budget_bytes,
            "requested_context_len": self.requested_context_len,
            "max_num_seqs": self.max_num_seqs,
            "rows": [dict(asdict(r), fits=r.fits) for r in self.rows],
            "choice": dict(asdict(self.choice), fits=self.choice.fits),
            "forced": self.forced,
            "note": self.note,
            "notes": list(self.notes),
        }


def unquantized_format(device: DeviceSpec) -> str:
    """``bf16`` on CUDA and on CPUs with native bf16 arithmetic, else ``fp32``."""
    return "bf16" if device.native_bf16 else "fp32"


def available_formats(device: DeviceSpec) -> tuple[str, ...]:
    """Formats offered on ``device``, best quality first (fp8 only where ``device.fp8``)."""
    quant = tuple(f for f in QUANT_FORMATS if f != "fp8" or device.fp8)
    return (unquantized_format(device), *quant)


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


def plan_memory(
    model_config: ModelConfig,
    budget_bytes: int,
    context_len: int,
    max_num_seqs: int = 1,
    draft: ModelConfig | None = None,
    device: DeviceSpec | str = "cpu",
    *,
    quant: str = "auto",
    max_num_batched_tokens: int = 2048,
    num_speculative_tokens: int = 4,
    overhead_bytes: int | None = None,
    block_size: int = 16,
    int4_group_size: int = INT4_GROUP_SIZE,
    draft_int4_group_size: int | None = None,
) -> MemoryPlan:
    """Plan weights + KV + draft + activations + runtime overhead for each weight format.

    ``context_len`` is tokens per sequence (prompt + reply); the KV pool holds
    ``context_len x max_num_seqs`` tokens, rounded up to ``block_size`` blocks. The draft (same
    tokenizer, same weight format as the target) adds its weights, its own KV for the same
    tokens, and ``num_speculative_tokens + 1`` logit rows per sequence. ``quant`` is ``auto``
    (best that fits), ``none`` (unquantized) or a format name (forced). ``device`` is a
    ``DeviceSpec`` or ``"cpu"``/``"cuda"`` (detected here). ``overhead_bytes`` defaults to the
    device's runtime overhead (``DeviceSpec.runtime_overhead_bytes``). ``int4_group_size`` /
    ``draft_int4_group_size``: the int4 groups the loader will use (32 for GGUF sources).

    Raises ``ValueError`` for bad arguments (unknown or unavailable format, non-positive sizes)
    and ``MemoryPlanError`` (with the numbers) when nothing fits at ``MIN_CONTEXT_LEN`` tokens.
    """
    if isinstance(device, str):
        device = DeviceSpec.detect(device)
    if context_len <= 0 or max_num_seqs <= 0 or budget_bytes <= 0:
        raise ValueError("context_len, max_num_seqs and budget_bytes must be positive")
    formats = available_formats(device)
    forced = quant not in ("auto", None)
    if quant == "none":
        quant = formats[0]
    if forced and quant not in formats:
        where = "this device" if quant != "fp8" else "this device (fp8 needs CUDA cc >= 8.9)"
        raise ValueError(f"format {quant!r} is not available on {where}; "
                         f"choose one of: {', '.join(formats)}")
    overhead = device.runtime_overhead_bytes if overhead_bytes is None else overhead_bytes

    def row(fmt: str, ctx: int) -> PlanRow:
        act = unquantized_format(device)
        tokens = _round_up(ctx * max_num_seqs, block_size)
        rows_per_seq = 1 + (num_speculative_tokens if draft is not None else 0)
        parts = {
            "weight_bytes": weight_bytes(model_config, fmt, act, device.type, int4_group_size),
            "kv_bytes": kv_bytes(model_config, tokens, act),
            "draft_weight_bytes": weight_bytes(
                draft, fmt, act, device.type, draft_int4_group_size or int4_group_size
            ) if draft else 0,
            "draft_kv_bytes": kv_bytes(draft, tokens, act) if draft else 0,
            "activation_bytes": max(
                activation_bytes(cfg, context_len=ctx, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens, act_dtype=act,
                                 logit_rows=max_num_seqs * rows_per_seq)
                for cfg in (model_config, draft) if cfg is not None
            ),
            "overhead_bytes": overhead,
        }
        total = sum(parts.values())
        return PlanRow(fmt, ctx, **parts, total_bytes=total, margin_bytes=budget_bytes - total)

    rows = tuple(row(f, context_len) for f in formats)
    candidates = [quant] if forced else list(formats)
    notes = tuple(n for n in [device.note] if n)
    common = {"device": device, "budget_bytes": budget_bytes, "requested_context_len": context_len,
                  "max_num_seqs": max_num_seqs, "rows": rows, "forced": forced, "notes": notes}
    for r in rows:
        if r.format in candidates and r.fits:
            return MemoryPlan(choice=r, **common)
    floor = min(MIN_CONTEXT_LEN, context_len)
    for fmt in candidates:
        ctx = _max_context(lambda n, fmt=fmt: row(fmt, n).fits, floor, context_len, block_size)
        if ctx is not None:
            note = (f"context lowered from {context_len} to {ctx} tokens to fit "
                    f"{_gib(budget_bytes)} in {fmt}")
            return MemoryPlan(choice=row(fmt, ctx), note=note, **common)
    smallest = min((r for r in rows if r.format in candidates), key=lambda r: r.total_bytes)
    at_floor = row(smallest.format, floor)
    raise MemoryPlanError(
        f"{'the forced format' if forced else 'no format'} fits in {_gib(budget_bytes)}: "
        f"{smallest.format} needs {_gib(at_floor.total_bytes)} at {floor} tokens of context "
        f"(weights {_gib(at_floor.weight_bytes + at_floor.draft_weight_bytes)}, KV "
        f"{_gib(at_floor.kv_bytes + at_floor.draft_kv_bytes)}, activations "
        f"{_gib(at_floor.activation_bytes)}, runtime {_gib(at_floor.overhead_bytes)}); "
        "use a smaller model, or free memory"
    )


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


def _max_context(fits, lo: int, hi: int, step: int) -> int | None:
    """Largest multiple of ``step`` in ``[lo, hi]`` (or ``lo`` itself) with ``fits(n)``."""
    if not fits(lo):
        return None
    lo_k, hi_k = -(-lo // step), hi // step
    if lo_k > hi_k or not fits(lo_k * step):
        return lo
    while lo_k < hi_k:
        mid = (lo_k + hi_k + 1) // 2
        lo_k, hi_k = (mid, hi_k) if fits(mid * step) else (lo_k, mid - 1)
    return lo_k * step


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


__all__ = ["MIN_CONTEXT_LEN", "MemoryPlan", "MemoryPlanError", "PlanRow", "activation_bytes",
           "available_formats", "kv_bytes", "plan_memory", "unquantized_format",
           "weight_bytes"]
