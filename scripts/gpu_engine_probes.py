"""Stage 3's measurements for ``gpu_engine_e2e.py``, each through a built ``LLMEngine``: the
forward's device time per step (``ForwardTimer``, CUDA events around the runner's forward),
decode tok/s at a batch size and context, time to first token with and without a cached
prefix, and what a step verifying k = 4 drafts costs against a plain decode step."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench_e2e import sync

from localchat.engine.config import ModelConfig, SpeculativeConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams


class ForwardTimer:
    """CUDA events around ``ModelRunner._forward`` (no sync added): the GPU ms of each step's
    forward, read after the timed loop. On CPU, ``perf_counter`` around the call."""

    def __init__(self, runner, device) -> None:
        self.runner, self.device, self.events, self.cpu = runner, device, [], []
        self._orig = runner._forward

        def timed(*a, **k):
            if device.type == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = self._orig(*a, **k)
                e.record()
                self.events.append((s, e))
                return out
            t0 = time.perf_counter()
            out = self._orig(*a, **k)
            self.cpu.append(time.perf_counter() - t0)
            return out
        runner._forward = timed

    def reset(self) -> None:
        self.events.clear()
        self.cpu.clear()

    def total_s(self) -> float:
        sync(self.device)
        if self.device.type == "cuda":
            return sum(s.elapsed_time(e) for s, e in self.events) / 1e3
        return sum(self.cpu)

    def close(self) -> None:
        self.runner._forward = self._orig


def decode_run(engine: LLMEngine, bs: int, context: int, steps: int, vocab: int, seed: int
               ) -> dict:
    """``bs`` requests of ``context`` random prompt ids; once all decode, time ``steps``
    ``engine.step()`` calls. Returns wall, forward-GPU and per-step figures."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(bs):
        prompt = torch.randint(0, vocab - 1, (context,), generator=gen).tolist()
        ids.append(engine.add_request(None, prompt, SamplingParams(
            temperature=0.0, max_tokens=steps + 8, ignore_eos=True)))
    while len(engine.scheduler.waiting) or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()
    timer = ForwardTimer(engine.runner, engine.device)
    try:
        sync(engine.device)
        per_step = []
        t0 = time.perf_counter()
        for _ in range(steps):
            s0 = time.perf_counter()
            engine.step()
            per_step.append(time.perf_counter() - s0)
        sync(engine.device)
        wall = time.perf_counter() - t0
        fwd = timer.total_s()
    finally:
        timer.close()
    running = len(engine.scheduler.running)
    for rid in ids:
        engine.abort_request(rid)
    return {"wall_s": wall, "forward_s": fwd, "median_step_s": statistics.median(per_step),
            "running": running}


def ttft(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds from ``add_request`` to the first token of ``prompt``; its cached tokens."""
    sync(engine.device)
    t0 = time.perf_counter()
    rid = engine.add_request(None, prompt, SamplingParams(temperature=0.0, max_tokens=1,
                                                          ignore_eos=True))
    while True:
        outs = [o for o in engine.step() if o.request_id == rid]
        if outs and outs[-1].new_token_ids:
            sync(engine.device)
            return time.perf_counter() - t0, outs[-1].num_cached_tokens


def execute_time(engine: LLMEngine, steps: int) -> float:
    """Median seconds of ``runner.execute_model`` (it ends in the step's one sync) over
    ``steps`` steps of whatever is running."""
    orig, times = engine.runner.execute_model, []

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = orig(*a, **k)
        sync(engine.device)
        times.append(time.perf_counter() - t0)
        return out
    engine.runner.execute_model = timed
    try:
        for _ in range(steps):
            engine.step()
    finally:
        engine.runner.execute_model = orig
    return statistics.median(times)


def spec_verify_cost(engine: LLMEngine, cfg: ModelConfig, draft, dcfg: ModelConfig, args
                     ) -> dict:
    """Target ``execute_model`` ms per step with ``draft`` (planned with the engine's pools)
    proposing k = 4 tokens, over the same without the draft, batch 1 over a ``--context``
    prompt. The draft's KV pool is allocated here, as ``build_engine`` does after the engine."""
    import dataclasses

    from localchat.engine.spec_decode.speculator import Speculator

    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, cfg.vocab_size - 1, (args.context,), generator=gen).tolist()
    sp = SamplingParams(temperature=0.0, max_tokens=4 * args.steps, ignore_eos=True)
    rid = engine.add_request(None, prompt, sp)
    while engine.scheduler.running and \
            engine.scheduler.running[0].num_computed_tokens < len(prompt) or \
            engine.scheduler.waiting:
        engine.step()
    engine.step()
    plain = execute_time(engine, 8)
    engine.abort_request(rid)
    config = dataclasses.replace(engine.config, speculative=SpeculativeConfig(
        draft_model="random-1-layer", num_speculative_tokens=4, adaptive=False))
    engine.speculator = Speculator.build(
        draft, dcfg, cfg, config, engine.num_blocks * config.cache.block_size,
        engine.max_model_len)
    try:
        rid = engine.add_request(None, prompt, sp)
        for _ in range(3):
            engine.step()
        verify = execute_time(engine, 8)
        drafted = engine.get_stats().spec
        engine.abort_request(rid)
    finally:
        engine.speculator = None
    return {"decode_execute_ms": 1e3 * plain, "verify_k4_execute_ms": 1e3 * verify,
            "verify_k4_over_decode_step": verify / plain, "spec_stats": repr(drafted)[:300],
            "speculative_speedup": "not available (random weights: acceptance is meaningless)"}
