"""The memory figures ``ask --json`` reports, in the planner's terms (issue 18: one plan, one
context, reported the same way everywhere).

``memory_figures(engine)`` puts the planner's prediction for the engine as loaded (its weight
format, its context ``max_model_len`` and its KV pool, ``engine/memory/report.py``) beside what
was *allocated*: the bytes of the tensors the engine holds (weights, buffers, the KV cache
pool; the draft model's too), counted once per storage. Allocated bytes do not depend on
whether the OS has touched a page yet, unlike a process's RSS (reported apart, as
``rss_bytes``), so ``measured_bytes`` compares like with like with ``predicted_bytes``. The
runtime's own baseline (Python, PyTorch) is reported as ``runtime_overhead_bytes`` and is in
neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def allocated_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights counted once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def engine_tensors(engine: Any) -> list[torch.Tensor]:
    """The weights, buffers and KV cache tensors of a loaded ``LLMEngine`` (and its draft)."""
    out: list[torch.Tensor] = []
    runners = [getattr(engine, "runner", None)]
    speculator = getattr(engine, "speculator", None)
    if speculator is not None:
        runners.append(getattr(speculator, "runner", None))
    for runner in runners:
        if runner is None:
            continue
        model = getattr(runner, "model", None)
        if model is not None:
            out += list(model.parameters()) + list(model.buffers())
            out += [v for m in model.modules() for v in vars(m).values()
                    if isinstance(v, torch.Tensor)]  # quantized weights kept as attributes
        out += list(getattr(runner, "kv_caches", None) or [])
    return out


def memory_figures(engine: Any) -> dict[str, Any]:
    """``ask --json``'s ``memory`` object (bytes; ``context`` and ``kv_pool_tokens`` in tokens).

    Raises:
        AttributeError, TypeError, ValueError: not a real ``LLMEngine`` (a fake in tests).
    """
    from localchat.engine.memory.budget import process_rss_bytes
    from localchat.engine.memory.report import memory_report

    report = memory_report(engine)
    rss = process_rss_bytes() if engine.device.type == "cpu" else None
    return {
        "format": report.format,
        "context": engine.max_model_len,
        "kv_pool_tokens": engine.num_blocks * engine.config.cache.block_size,
        "weight_bytes": report.weight_bytes,
        "kv_bytes": report.kv_bytes,
        "predicted_bytes": report.weight_bytes + report.kv_bytes,
        "measured_bytes": allocated_bytes(engine_tensors(engine)),
        "measured": "bytes allocated for weights and the KV cache",
        "runtime_overhead_bytes": report.overhead_bytes,
        "rss_bytes": rss,
    }
