"""Per decode step cost breakdown: where the host time of one engine step goes.

Usage::

    python scripts/bench_step.py                       # SmolLM2-135M, native, the engine's dtype
    python scripts/bench_step.py --quant int4 --dtype float32 --steps 64 --threads 2

One request, batch 1, a 512-token prompt (ids 100..611, EOS ignored), greedy. After the
prefill and a few warm-up decode steps, ``--steps`` decode steps of ``LLMEngine.step()`` are
measured. Printed per step (medians over the steps):

* ``wall``: ``perf_counter`` around ``engine.step()`` (schedule, batch building, forward,
  logits, sampling, output processing, detokenization).
* ``forward``: ``perf_counter`` around the model's ``forward`` (the decoder stack, without the
  LM head); ``outside``: wall minus forward (scheduling, batch building, LM head, sampling,
  output processing).
* ``aten ops``: number of operator calls the torch profiler records per step (every level,
  custom ``torch.library`` ops included) and the number of top-level ones (calls made from
  Python, not from inside another op).
* ``aten ms``: the summed duration of the top-level operator calls per step, from a second,
  profiled run of ``--steps`` steps (``torch.profiler``, CPU activity).
* ``overhead``: "Python and scheduling overhead" = unprofiled median wall minus the profiled
  mean top-level ATen time per step. The profiler adds a little time to each op it records,
  so this estimate errs low (the real overhead is at least this much larger as more ops are
  recorded); ``overhead (prof)`` = profiled wall minus ATen time errs high (it also counts the
  profiler's own bookkeeping between ops). The truth lies between the two.

Figures on a loaded, shared machine are noisy: compare two runs of this script made one after
the other (e.g. a branch against ``main``), never against a figure from another session.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from localchat.engine.config import EngineConfig, QuantConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams

DEFAULT_GGUF = (Path.home() / ".cache/localchat/models/smollm2-135m"
                / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _timed_forward(model, sink: list[float]):
    """Wrap ``model.forward`` so each call appends its wall seconds to ``sink``."""
    inner = model.forward

    def forward(*args, **kwargs):
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        sink.append(time.perf_counter() - t0)
        return out

    model.forward = forward


def _top_level_ms(prof) -> tuple[int, int, float]:
    """``(all ops, top-level ops, top-level ms)`` summed over a profile's events."""
    events = prof.events()
    top = [e for e in events if e.cpu_parent is None]
    return len(events), len(top), sum(e.time_range.elapsed_us() for e in top) / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--quant", default="native")
    ap.add_argument("--dtype", default="auto",
                    help="float32, bfloat16, ... or auto (the engine's default for this CPU)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prof-steps", type=int, default=8, help="steps under the profiler")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--table", action="store_true", help="print the profiler table too")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eng = LLMEngine.from_path(args.model, EngineConfig(
        device="cpu", dtype=None if args.dtype == "auto" else getattr(torch, args.dtype),
        quant=QuantConfig(scheme=args.quant)))
    ids = list(range(100, 100 + args.prompt_len))
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    for _ in range(1):  # a warm-up request (first steps after a load are slow)
        eng.reset_prefix_cache()
        list(eng.generate(ids, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)))
    forward_s: list[float] = []
    _timed_forward(eng.runner.model, forward_s)

    cpu_s: list[float] = []

    def run_steps(n: int) -> list[float]:
        walls = []
        for _ in range(n):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            eng.step()
            walls.append(time.perf_counter() - t0)
            cpu_s.append(time.thread_time() - c0)
        return walls

    eng.reset_prefix_cache()
    eng.add_request("bench", ids, params)
    eng.step()  # prefill
    run_steps(8)
    forward_s.clear()
    cpu_s.clear()
    walls = run_steps(args.steps)
    fwd, cpu = forward_s[:], cpu_s[:]
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(args.prof_steps)
    prof_wall = (time.perf_counter() - t0) / args.prof_steps * 1e3
    eng.abort_request("bench")
    n_all, n_top, aten_ms = _top_level_ms(prof)
    aten_ms /= args.prof_steps
    wall = statistics.median(walls) * 1e3
    fwd_ms = statistics.median(fwd) * 1e3
    print(f"model {args.model.name} quant={args.quant} dtype={args.dtype} "
          f"threads={args.threads} steps={args.steps}/{args.prof_steps} (batch 1, {args.prompt_len}-token prompt)")
    print(f"wall ms/step          {wall:8.3f}")
    print(f"forward ms/step       {fwd_ms:8.3f}")
    print(f"outside ms/step       {wall - fwd_ms:8.3f}")
    print(f"main-thread cpu ms    {statistics.median(cpu) * 1e3:8.3f}  (time.thread_time)")
    print(f"aten ops/step         {n_all / args.prof_steps:8.1f}  "
          f"(top-level {n_top / args.prof_steps:.1f})")
    print(f"aten ms/step (prof)   {aten_ms:8.3f}")
    print(f"overhead ms/step      {wall - aten_ms:8.3f}  (unprofiled wall - aten)")
    print(f"overhead (prof)       {prof_wall - aten_ms:8.3f}  (profiled wall {prof_wall:.3f} - aten)")
    if args.table:
        print(prof.key_averages().table(sort_by=os.environ.get("SORT","count"), row_limit=40))
    return 0


if __name__ == "__main__":
    sys.exit(main())
