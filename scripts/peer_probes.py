"""The two probes ``bench_peers.py`` reports beside tok/s: the machine's read bandwidth and
localchat's cost of a 5-token forward (what verifying 4 draft tokens costs) over a 1-token step.
"""

from __future__ import annotations

import statistics
import time

import torch


def read_bandwidth_gbs(mib: int = 512) -> float:
    """Best-of-3 GB/s of ``torch.sum`` over an ``mib`` MiB fp32 buffer (read only)."""
    buf = torch.ones(mib * 2**20 // 4)
    buf.sum()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


def forward5_over_step(engine, ids: list[int], pairs: int) -> float:
    """Median over ``pairs`` of (model forward over 5 new tokens after ``ids`` with 5 rows of
    logits) / (forward over 1 new token with 1 row), alternating, on localchat's own model and
    KV cache (the engine is idle; its prefix cache is reset after). Both run on the kernels
    the engine's decode and draft verification run: an automatically fp32 CPU engine
    (``engine.a8_fp32``) decodes inside ``kernels.a8_fp32()``, so they do too."""
    import contextlib

    from localchat import kernels
    from localchat.engine.step_inputs import BatchEntry, build_batch

    runner = engine.runner
    model, bs = runner.model, runner.block_size
    blocks = list(range(-(-(len(ids) + 8) // bs)))

    def forward(start, tokens, rows):
        t0 = time.perf_counter()
        input_ids, positions, meta, groups = build_batch(
            [BatchEntry(blocks, start, tokens, rows)], bs, runner.device, runner.staging)
        hidden = model(input_ids, positions, runner.kv_caches, meta)
        model.compute_logits(hidden[groups[0]]).argmax(-1).tolist()
        return time.perf_counter() - t0

    ratios = []
    decode_kernels = (kernels.a8_fp32() if getattr(engine, "a8_fp32", False)
                      else contextlib.nullcontext())
    with torch.inference_mode(), decode_kernels:
        forward(0, ids, "last")  # the prompt's KV
        tail = ids[-5:]
        forward(len(ids), tail, "all"), forward(len(ids), tail[:1], "last")  # warm both shapes
        for _ in range(pairs):
            five = forward(len(ids), tail, "all")
            one = forward(len(ids), tail[:1], "last")
            ratios.append(five / one)
    engine.reset_prefix_cache()
    return statistics.median(ratios)


