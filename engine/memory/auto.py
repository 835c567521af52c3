"""``--quant auto``: the memory planner's choice of weight format, applied at load time.

``choose_scheme`` plans one sequence at the engine's context length (the interactive case;
the KV pool itself is sized separately from the memory left, see ``LLMEngine``) with the draft
model when there is one, and returns the quantization scheme to load plus the plan, so the
caller can log it and cap the context when the plan had to lower it.
"""

from __future__ import annotations

import logging

import torch

from ..config import ModelConfig
from .budget import DeviceSpec, default_budget_bytes
from .planner import MemoryPlan, plan_memory

logger = logging.getLogger(__name__)

# Planner format -> QuantConfig scheme (the unquantized formats load as "none").
_SCHEME = {"fp32": "none", "bf16": "none", "fp16": "none", "fp8": "fp8", "int8": "int8",
           "int4": "int4", "native": "native"}


def choose_scheme(model_config: ModelConfig, device: torch.device, context_len: int, *,
                  draft: ModelConfig | None = None, budget_bytes: int | None = None,
                  max_num_batched_tokens: int = 2048, int4_group_size: int = 128,
                  native_bytes: int | None = None, draft_native_bytes: int | None = None,
                  kv_cache_dtype: str = "auto") -> tuple[str, MemoryPlan]:
    """The best weight format that fits this machine for ``context_len`` tokens.

    ``native_bytes`` (a GGUF source: ``loader.native.native_weight_bytes``) offers the file's
    own format: it is chosen whenever it holds no more than the planner's choice (so it fits
    wherever that does; the draft likewise with ``draft_native_bytes`` when there is one),
    i.e. unless the memory plan forces something smaller.

    Returns ``(scheme, plan)`` with ``scheme`` in ``native|none|fp8|int8|int4``; ``plan.context_len``
    may be below ``context_len`` (``plan.note`` says so). ``budget_bytes`` defaults to the
    free memory of ``device`` minus a margin. Raises ``MemoryPlanError`` (with the numbers)
    when no format fits even at 2,048 tokens.
    """
    spec = DeviceSpec.detect(device.type)
    budget = budget_bytes if budget_bytes is not None else default_budget_bytes(device.type)
    plan = plan_memory(model_config, budget, context_len, 1, draft, spec,
                       max_num_batched_tokens=max_num_batched_tokens,
                       int4_group_size=int4_group_size,
                       native_weight_bytes=native_bytes,
                       draft_native_weight_bytes=draft_native_bytes,
                       kv_cache_dtype=kv_cache_dtype)
    logger.info("memory plan: %s at %d tokens of context (budget %.2f GiB, needs %.2f GiB)%s",
                plan.format, plan.context_len, budget / 2**30, plan.choice.total_bytes / 2**30,
                f"; {plan.note}" if plan.note else "")
    scheme = _SCHEME[plan.format]
    if native_bytes is not None and native_bytes <= plan.choice.weight_bytes and (
            draft is None or (draft_native_bytes is not None
                              and draft_native_bytes <= plan.choice.draft_weight_bytes)):
        logger.info("weights: the GGUF's own format (%.2f GiB, planner's %s %.2f GiB)",
                    native_bytes / 2**30, plan.format, plan.choice.weight_bytes / 2**30)
        scheme = "native"
    return scheme, plan
