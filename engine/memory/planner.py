"""The memory planner: weights + KV cache + draft + activations + runtime, per weight format.

``plan_memory`` predicts, before anything is downloaded or allocated, how many bytes a model
needs on a device in each weight format, and picks the highest-quality format that fits the
budget (unquantized bf16/fp32 > fp8 > int8 > int4). When none fits at the requested context it
lowers the context (never below ``MIN_CONTEXT_LEN`` tokens); when still nothing fits it raises
``MemoryPlanError`` with the numbers. Every figure is in bytes.

The parts' bytes come from ``footprint.py`` (weights exact from parameter shapes, KV cache,
activations); the budget and the device's traits from ``budget.py``. Reference designs:
vLLM's ``determine_num_available_blocks`` (profile, then size the KV pool) and llama.cpp's
automatic fitting of layers and context to device memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..config import ModelConfig
from ..config import kv_cache_dtype as resolve_kv_dtype
from ..errors import LocalchatError
from .budget import DeviceSpec
from .footprint import INT4_GROUP_SIZE, activation_bytes, kv_bytes, weight_bytes

MIN_CONTEXT_LEN = 2048
# The planner's weight formats: the unquantized ones (everything in that dtype) and the
# quantized ones, best quality first (decoder linears quantized, the rest unquantized).
FLOAT_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
QUANT_FORMATS = ("fp8", "int8", "int4")


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
    """``bf16`` on CUDA sm_80+ and on CPUs with native bf16 arithmetic; else ``fp16`` on
    CUDA (pre-sm_80) and ``fp32`` on CPU."""
    if device.native_bf16:
        return "bf16"
    return "fp16" if device.type == "cuda" else "fp32"


def available_formats(device: DeviceSpec) -> tuple[str, ...]:
    """Formats offered on ``device``, best quality first (fp8 only where ``device.fp8``)."""
    quant = tuple(f for f in QUANT_FORMATS if f != "fp8" or device.fp8)
    return (unquantized_format(device), *quant)


def format_weight_bytes(config: ModelConfig, fmt: str, act_dtype: torch.dtype,
                        device_type: str, int4_group_size: int = INT4_GROUP_SIZE) -> int:
    """Weight bytes of ``config`` in the planner's format ``fmt`` (``footprint.weight_bytes``):
    ``bf16``/``fp32`` hold everything in that dtype; ``fp8``/``int8``/``int4`` quantize the
    decoder linears and keep the rest in ``act_dtype``. Raises ``ValueError`` for an unknown
    format."""
    if fmt in FLOAT_FORMATS:
        return weight_bytes(config, "none", device_type, FLOAT_FORMATS[fmt])
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}")
    return weight_bytes(config, fmt, device_type, act_dtype, int4_group_size)


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
    native_weight_bytes: int | None = None,
    draft_native_weight_bytes: int | None = None,
    kv_cache_dtype: str = "auto",
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
    ``kv_cache_dtype`` (``CacheConfig.kv_cache_dtype``) sizes the KV pools (fp16 under an
    fp32 CPU engine by default). ``native_weight_bytes`` (a GGUF target, under ``auto``: the
    exact bytes of its own format,
    ``loader.native.native_weight_bytes``; with a draft, ``draft_native_weight_bytes`` too,
    the draft's own, or native is not planned): when no other format fits, the ``native``
    format (target and draft each in its file's own) is planned (at the requested context,
    then lowered) before giving up, so a 1.1 GB Q4_K file is not refused for want of a 1.6 GB
    int4 copy.

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

    act = FLOAT_FORMATS[unquantized_format(device)]
    # the KV cache's elements (fp16 under an fp32 CPU engine by default: config.kv_cache_dtype)
    kv = resolve_kv_dtype(kv_cache_dtype, device.type, act)

    def row(fmt: str, ctx: int) -> PlanRow:
        tokens = _round_up(ctx * max_num_seqs, block_size)
        rows_per_seq = 1 + (num_speculative_tokens if draft is not None else 0)
        parts = {
            "weight_bytes": native_weight_bytes if fmt == "native" else format_weight_bytes(
                model_config, fmt, act, device.type, int4_group_size),
            "kv_bytes": kv_bytes(model_config, tokens, kv),
            "draft_weight_bytes": 0 if not draft else draft_native_weight_bytes
            if fmt == "native" else format_weight_bytes(
                draft, fmt, act, device.type, draft_int4_group_size or int4_group_size),
            "draft_kv_bytes": kv_bytes(draft, tokens, kv) if draft else 0,
            "activation_bytes": max(
                activation_bytes(cfg, context_len=ctx, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens, dtype=act,
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
    common = {"device": device, "budget_bytes": budget_bytes, "max_num_seqs": max_num_seqs,
              "requested_context_len": context_len, "rows": rows, "forced": forced,
              "notes": notes}
    for r in rows:
        if r.format in candidates and r.fits:
            return MemoryPlan(choice=r, **common)
    floor = min(MIN_CONTEXT_LEN, context_len)
    if native_weight_bytes is not None and not forced and (
            draft is None or draft_native_weight_bytes is not None):
        native = row("native", context_len)
        if native.fits:
            return MemoryPlan(choice=native, **common)
        candidates.append("native")  # tried last at a lowered context
    for fmt in candidates:
        ctx = _max_context(lambda n, fmt=fmt: row(fmt, n).fits, floor, context_len, block_size)
        if ctx is not None:
            note = (f"context lowered from {context_len} to {ctx} tokens to fit "
                    f"{_gib(budget_bytes)} in {fmt}")
            return MemoryPlan(choice=row(fmt, ctx), note=note, **common)
    # the smallest candidate, the GGUF's own format included where it was tried
    tried = [r for r in rows if r.format in candidates]
    if "native" in candidates:
        tried.append(row("native", context_len))
    smallest = min(tried, key=lambda r: r.total_bytes)
    at_floor = row(smallest.format, floor)
    raise MemoryPlanError(
        f"{'the forced format does not fit' if forced else 'no format fits'} in "
        f"{_gib(budget_bytes)}: "
        f"{smallest.format} needs {_gib(at_floor.total_bytes)} at {floor} tokens of context "
        f"(weights {_gib(at_floor.weight_bytes + at_floor.draft_weight_bytes)}, KV "
        f"{_gib(at_floor.kv_bytes + at_floor.draft_kv_bytes)}, activations "
        f"{_gib(at_floor.activation_bytes)}, runtime {_gib(at_floor.overhead_bytes)}); "
        "use a smaller model, or free memory"
    )


# -- helpers ---------------------------------------------------------------------------------


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


__all__ = ["FLOAT_FORMATS", "MIN_CONTEXT_LEN", "QUANT_FORMATS", "MemoryPlan", "MemoryPlanError",
           "PlanRow", "available_formats", "format_weight_bytes", "plan_memory",
           "unquantized_format"]
