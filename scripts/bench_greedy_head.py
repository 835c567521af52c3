"""Benchmark the greedy output layer (``engine/layers/greedy_head.py``) on the bundle models.

For each model, loaded as ``ask`` loads it (``--quant auto``; on a CPU without native bf16
the engine decodes fp32 activations through the integer-dot kernels, where the greedy head
applies):

- the output layer on one real hidden row, rounds interleaved, min / median ms: one
  integer-dot pass; the two passes plus argmax (what a greedy step paid before); the greedy
  head (one pass, the bound, exact rescoring);
- over the hidden rows of a few sampled replies: candidates per row (median / p90 / max),
  rows that took the two-pass fallback, and agreement of the greedy tokens with the argmax of
  the exact kernel's logits (rows whose exact top two differ by more than 1e-4);
- greedy decode tok/s (a short prompt, ``--new-tokens``) with the head's bound and without it
  (the two-pass path), rounds interleaved in this process, and the ratio.

Usage: ``python scripts/bench_greedy_head.py [--models smollm2-135m ...] [--threads 2]
[--rounds 3] [--new-tokens 128]``. Needs the C++ kernels and the models in the local cache
(``localchat pull``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = ["def fib(n):", "Write a haiku about the sea.", "What is the capital of France?"]


def _timed(fn, n: int = 30) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _hidden_rows(engine, model, tokens: int) -> torch.Tensor:
    from localchat.engine.sampling_params import SamplingParams

    rows = []
    logits_of = model.compute_logits

    def capture(h, draft=False):
        rows.append(h.detach().float().clone())
        return logits_of(h, draft)

    model.compute_logits = capture
    try:
        for text in PROMPTS:
            ids = engine.tokenizer.encode(text)
            list(engine.generate(ids, SamplingParams(temperature=0.7, max_tokens=tokens,
                                                     ignore_eos=True, seed=1)))
    finally:
        model.compute_logits = logits_of
    return torch.cat(rows)


def _decode_tok_s(engine, new_tokens: int) -> float:
    from localchat.engine.sampling_params import SamplingParams

    engine.reset_prefix_cache()
    ids = engine.tokenizer.encode(PROMPTS[0])
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    first = None
    n = 0
    for out in engine.generate(ids, params):
        if first is None:  # time from the first token on: decode steps only
            first = time.perf_counter()
        n = len(out.output_token_ids)
    return (n - 1) / (time.perf_counter() - first)


def bench(alias: str, args) -> None:
    import bench_peers as bp

    from localchat import kernels
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.layers import greedy_head

    path = resolve_model(alias, cache_dir=cache_dir(), download=False).path
    e = bp.Localchat(path, "auto", cache_dir())
    engine = e.engine
    model = engine.runner.model
    head = model.model.embed_tokens if model.lm_head is None else model.lm_head
    if not greedy_head.has_bound(head) or not engine.a8_fp32:
        print(f"{alias}: the greedy head does not apply here (bound: "
              f"{greedy_head.has_bound(head)}, fp32 integer-dot decode: {engine.a8_fp32})")
        return
    print(f"\n{alias}: output layer {type(head.quant_method).__name__} "
          f"[{head.out_features} x {head.in_features}]")
    h = _hidden_rows(engine, model, 40)
    x = h[len(h) // 2:len(h) // 2 + 1]
    fn = lambda z: head.quant_method.apply(head, z)
    times: dict[str, list[float]] = {"one pass": [], "two passes + argmax": [],
                                     "greedy head": []}
    with torch.inference_mode(), kernels.a8_fp32():
        for _ in range(args.rounds):
            times["one pass"] += _timed(lambda: fn(x))
            times["two passes + argmax"] += _timed(
                lambda: kernels.a8_two_pass(fn, x).max(-1))
            times["greedy head"] += _timed(lambda: greedy_head.greedy_token_ids(head, x))
    for name, t in times.items():
        print(f"  {name:22s} min {min(t):6.2f} ms  median {statistics.median(t):6.2f} ms")

    counts = []
    candidates = greedy_head._candidates

    def counting(logits_row, bound):
        ids = candidates(logits_row, bound)
        counts.append(ids.shape[0])
        return ids

    greedy_head._candidates = counting
    try:
        with torch.inference_mode(), kernels.a8_fp32():
            tokens = greedy_head.greedy_token_ids(head, h)
            two = torch.cat([kernels.a8_two_pass(fn, h[i:i + 1]) for i in range(len(h))])
        with torch.inference_mode(), kernels.a8_fp32(False):
            exact = torch.cat([fn(h[i:i + 16]) for i in range(0, len(h), 16)])
    finally:
        greedy_head._candidates = candidates
    # a fallback row counts twice (its one-pass and its two-pass candidates), in order
    cap = greedy_head.max_candidates(head)
    first, i = [], 0
    while i < len(counts):
        first.append(counts[i])
        i += 2 if counts[i] > cap else 1
    fallbacks = len(counts) - len(first)
    top2 = exact.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 1e-4
    want = exact.argmax(-1)
    print(f"  candidates per row over {len(h)} rows: median {statistics.median(first):.0f}, "
          f"p90 {sorted(first)[int(0.9 * len(first))]}, max {max(first)}; "
          f"two-pass fallbacks (over {cap}) {fallbacks}")
    print(f"  exact argmax agreement ({int(decided.sum())} decided rows): greedy head "
          f"{int((tokens == want)[decided].sum())}, two passes "
          f"{int((two.argmax(-1) == want)[decided].sum())}")

    with_bound = head._buffers[greedy_head.BUFFER]
    rates: dict[str, list[float]] = {"greedy head": [], "two passes": []}
    for _ in range(args.rounds):
        for name, rate in rates.items():
            if name == "two passes":
                del head._buffers[greedy_head.BUFFER]
            try:
                rate.append(_decode_tok_s(engine, args.new_tokens))
            finally:
                head._buffers[greedy_head.BUFFER] = with_bound
    for name, r in rates.items():
        print(f"  decode {name:12s} " + " ".join(f"{v:6.2f}" for v in r) + " tok/s")
    ratio = statistics.median(rates["greedy head"]) / statistics.median(rates["two passes"])
    print(f"  decode ratio (medians): {ratio:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for alias in args.models:
        bench(alias, args)


if __name__ == "__main__":
    main()
