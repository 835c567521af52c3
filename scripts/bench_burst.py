"""Prompt bursts: what batch invariance costs prompts that arrive together (CPU engine).

Usage::

    python scripts/bench_burst.py                                   # SmolLM2-135M, 8 x 40
    python scripts/bench_burst.py --model qwen2.5-coder-1.5b --prompts 8 --tokens 40

``--prompts`` requests of ``--tokens`` distinct prompt tokens each are added to an idle engine
at once (prefix cache emptied first, one token each, greedy), and ``LLMEngine.step()`` runs
until all have their first token. Printed: that wall time for an engine with
``SchedulerConfig.batch_invariant`` on (the default: each request computes what it would
alone; long prompts in their own GEMMs, a layer at a time with each weight dequantized once)
and off (``serve --no-batch-invariant``: one forward over every prompt), rounds interleaved,
best and median of ``--rounds``; the same for one prompt alone, the baseline. Both engines
are loaded in the process at once (the weights are mapped from one cache, so the second costs
little). Figures on a shared machine are noisy: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _engine(source, invariant: bool, cache_dir):
    from localchat.engine.config import EngineConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    return LLMEngine.from_source(source, EngineConfig(device="cpu", scheduler=SchedulerConfig(
        max_model_len=2048, max_num_seqs=64, batch_invariant=invariant)), cache_dir=cache_dir)


def _burst(engine, prompts: int, tokens: int, tag: str) -> float:
    """Seconds from adding ``prompts`` requests at once to the last one's first token."""
    from localchat.engine.sampling_params import SamplingParams

    engine.reset_prefix_cache()
    one = SamplingParams(temperature=0, max_tokens=1)
    for i in range(prompts):
        engine.add_request(f"{tag}-{i}", [1000 + 37 * i + j for j in range(tokens)], one)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    source = resolve_model(args.model, cache_dir=cache_dir(), download=False)
    engines = {"invariant (default)": _engine(source, True, cache_dir()),
               "--no-batch-invariant": _engine(source, False, cache_dir())}
    times: dict[str, list[float]] = {f"{name}, {n} prompt{'s' * (n > 1)}": []
                                     for n in (1, args.prompts) for name in engines}
    for engine in engines.values():  # warm-up: first-call costs out of the rounds
        _burst(engine, args.prompts, args.tokens, "warm")
    for r in range(args.rounds):
        for n in (1, args.prompts):
            for name, engine in engines.items():
                key = f"{name}, {n} prompt{'s' * (n > 1)}"
                times[key].append(_burst(engine, n, args.tokens, f"r{r}"))
    print(f"{args.model}: prompts of {args.tokens} tokens, {args.threads} threads, "
          f"{args.rounds} interleaved rounds; seconds to every first token")
    print("| engine, burst | best s | median s |\n|---|---|---|")
    for key, runs in times.items():
        print(f"| {key} | {min(runs):.3f} | {statistics.median(runs):.3f} |")


if __name__ == "__main__":
    main()
