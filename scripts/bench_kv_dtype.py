"""Decode speed with the KV cache in fp32 and in fp16 (``CacheConfig.kv_cache_dtype``) on an
fp32 CPU engine, the same weights, rounds interleaved in one process.

Usage::

    python scripts/bench_kv_dtype.py                                 # the bundle models
    python scripts/bench_kv_dtype.py --models smollm2-135m --contexts 512 4096 --rounds 3

For each model (its GGUF in the local cache, loaded as ``ask`` loads it: the file's own
format, ``--quant native``, fp32 activations on a CPU without native bf16) two engines share
the weights, one with each cache type. Per context length: a prompt of that many token
ids (ids 100.. repeated), then ``--new-tokens`` greedy tokens with EOS ignored; decode tok/s =
(new tokens - 1) / (time between the first and the last token), from ``RequestOutput.metrics``,
the best of ``--rounds`` rounds (fp32 and fp16 alternating; the prefix cache is reset before
each request). The two engines load the model each (the weight cache is memory-mapped: one
copy in RAM), so each keeps its own C++ decoder stacks. Prints decode tok/s for each cache, the ratio fp16 / fp32, and the cache's
bytes per token of context. Compare figures within one run only (a shared machine drifts).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def _gguf(alias: str) -> Path | None:
    from localchat.app.settings import cache_dir

    folder = cache_dir() / "models" / alias
    found = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    return found[0] if found else None


def _decode_tok_s(eng, n_prompt: int, n_new: int) -> float:
    from localchat.engine.sampling_params import SamplingParams

    eng.reset_prefix_cache()
    ids = [100 + i % 2000 for i in range(n_prompt)]
    rid = eng.add_request(None, ids, SamplingParams(temperature=0.0, max_tokens=n_new,
                                                   ignore_eos=True))
    out = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id == rid and o.finished:
                out = o
    m = out.metrics
    return (n_new - 1) / (m.last_token_time - m.first_token_time)


def main(argv: list[str] | None = None) -> int:
    from localchat.engine.config import CacheConfig, EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--contexts", nargs="+", type=int, default=[512, 4096])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.threads} threads; best of "
          f"{args.rounds} alternating rounds, {args.new_tokens} new tokens")
    print("| model | context | fp32 cache tok/s | fp16 cache tok/s | fp16 / fp32 | "
          "cache bytes per token (fp32 / fp16) |")
    print("|---|---|---|---|---|---|")
    for alias in args.models:
        path = _gguf(alias)
        if path is None:
            print(f"| {alias} | not in the local cache (localchat pull {alias}) |", file=sys.stderr)
            continue
        max_len = max(args.contexts) + args.new_tokens + 16
        config = EngineConfig(device="cpu", quant=QuantConfig(scheme="native"),
                              cache=CacheConfig(kv_cache_dtype="float32"),
                              scheduler=SchedulerConfig(max_model_len=max_len))
        fp32 = LLMEngine.from_path(path, config)
        fp16 = LLMEngine.from_path(path, dataclasses.replace(
            config, cache=CacheConfig(kv_cache_dtype="float16")))
        for ctx in args.contexts:
            best = {"fp32": 0.0, "fp16": 0.0}
            _decode_tok_s(fp32, ctx, 4)  # warm both shapes
            _decode_tok_s(fp16, ctx, 4)
            for _ in range(args.rounds):
                for name, eng in (("fp32", fp32), ("fp16", fp16)):
                    best[name] = max(best[name], _decode_tok_s(eng, ctx, args.new_tokens))
            print(f"| {alias} | {ctx} | {best['fp32']:.1f} | {best['fp16']:.1f} | "
                  f"{best['fp16'] / best['fp32']:.2f}x | {fp32.kv_bytes_per_token:,} / "
                  f"{fp16.kv_bytes_per_token:,} |", flush=True)
        del fp16, fp32
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
