"""The memory figures ``ask --json`` reports, in the planner's terms (issue 18: one plan, one
context, reported the same way everywhere).

``memory_figures(engine)`` puts the planner's prediction for the engine as loaded (its weight
format, its context ``max_model_len`` and its KV pool: ``LLMEngine.memory_report()``) beside
what was *allocated*: ``EngineInfo.allocated_bytes``, the bytes of the tensors the target model
holds (weights, buffers, the KV cache pool), counted once per storage. Allocated bytes do not
depend on whether the OS has touched a page yet, unlike a process's RSS (reported apart, as
``rss_bytes``), so ``measured_bytes`` compares like with like with ``predicted_bytes``. The
runtime's own baseline (Python, PyTorch) is reported as ``runtime_overhead_bytes`` and is in
neither. Only the engine's published surface is read (``get_info()``, ``memory_report()``).
"""

from __future__ import annotations

from typing import Any


def memory_figures(engine: Any) -> dict[str, Any]:
    """``ask --json``'s ``memory`` object (bytes; ``context`` and ``kv_pool_tokens`` in tokens).

    Raises:
        AttributeError, TypeError, ValueError: not a local ``LLMEngine`` (a remote engine or a
            fake in tests has no ``memory_report``).
    """
    from localchat.engine.memory.budget import process_rss_bytes

    info = engine.get_info()
    report = engine.memory_report()
    rss = process_rss_bytes() if info.device.type == "cpu" else None
    return {
        "format": report.format,
        "context": info.max_model_len,
        "kv_pool_tokens": info.num_blocks * info.block_size,
        "weight_bytes": report.weight_bytes,
        "kv_bytes": report.kv_bytes,
        "predicted_bytes": report.weight_bytes + report.kv_bytes,
        "measured_bytes": info.allocated_bytes,
        "measured": "bytes allocated for weights, buffers (RoPE tables) and the KV cache",
        "runtime_overhead_bytes": report.overhead_bytes,
        "rss_bytes": rss,
    }
