"""Qwen2.5-Coder-0.5B decode with Q5_0 held as int5 vs as int8 (``LOCALCHAT_CPU_INT5=0``, what
Q5_0 held before int5): both engines in one process, their decode steps interleaved round by
round, so both see the same machine load.

Workload: ``--quant native``, ``--dtype`` activations (bf16: the integer-dot kernels), batch 1,
a ``--prompt-len`` prompt (ids 100.., EOS ignored), greedy; after the prefill and 8 warm-up
steps, ``--rounds`` rounds of ``--steps`` decode steps of ``LLMEngine.step()`` per engine
(the order within a round alternates). Printed per engine: held bytes (parameters and buffers,
RoPE table excluded, as ``bench_load.py``; and against the GGUF's tensor bytes), the median
wall ms per step and its tok/s, the best round's median, and the main thread's CPU ms per step
(``time.thread_time``: less sensitive to other processes than wall time). Both load without
the quantized-weight cache (they share its key). A busy machine makes wall figures noise:
the load average is printed before and after. ``--prefills N`` (default 3) also times N
interleaved prefills of the prompt per engine (prefix cache reset, one ``step()``; the median).

Usage: ``python scripts/bench_int5_decode.py [--model PATH] [--dtype bfloat16] [--threads 2]
[--steps 16] [--rounds 6] [--prompt-len 512] [--prefills 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

DEFAULT_MODEL = (Path.home() / ".cache" / "localchat" / "models" / "qwen2.5-coder-0.5b"
                 / "Qwen2.5-Coder-0.5B-Instruct.gguf")


def _engine(model: Path, dtype: torch.dtype, int5: bool):
    from localchat.engine.config import EngineConfig, QuantConfig
    from localchat.engine.llm_engine import LLMEngine

    if int5:
        os.environ.pop("LOCALCHAT_CPU_INT5", None)
    else:
        os.environ["LOCALCHAT_CPU_INT5"] = "0"
    try:
        return LLMEngine.from_path(model, EngineConfig(
            device="cpu", dtype=dtype, quant=QuantConfig(scheme="native", use_cache=False)))
    finally:
        os.environ.pop("LOCALCHAT_CPU_INT5", None)


def _held(model) -> int:
    return sum(t.nbytes for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if "cos_sin_cache" not in n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--prefills", type=int, default=3)
    args = ap.parse_args(argv)

    from localchat.engine.loader.gguf import _tensor_index
    from localchat.engine.quant.native_int5 import Int5LinearMethod
    from localchat.engine.sampling_params import SamplingParams

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    ids = list(range(100, 100 + args.prompt_len))
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    gguf_bytes = sum(t["n_bytes"] for t in _tensor_index(args.model, None)["tensors"])
    engines = {}
    for name, int5 in (("int8", False), ("int5", True)):
        eng = _engine(args.model, dtype, int5)
        n5 = sum(isinstance(getattr(m, "quant_method", None), Int5LinearMethod)
                 for m in eng.runner.model.modules())
        assert (n5 > 0) == int5, (name, n5)
        engines[name] = (eng, _held(eng.runner.model))
    prefill = {name: [] for name in engines}
    for r in range(args.prefills):  # one request alone: the prompt's prefill, one step
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            eng = engines[name][0]
            eng.reset_prefix_cache()
            eng.add_request(f"prefill{r}", ids, SamplingParams(temperature=0.0, max_tokens=1))
            t0 = time.perf_counter()
            eng.step()
            prefill[name].append(time.perf_counter() - t0)
            eng.abort_request(f"prefill{r}")
            assert not eng.has_unfinished_requests()
    for eng, _ in engines.values():
        eng.reset_prefix_cache()
        eng.add_request("bench", ids, params)
        eng.step()  # prefill
        for _ in range(8):
            eng.step()
    print(f"{args.model.name}: dtype {args.dtype}, threads {args.threads}, {args.rounds} rounds "
          f"x {args.steps} steps, load average {os.getloadavg()}")
    walls = {name: [] for name in engines}
    cpus = {name: [] for name in engines}
    rounds = {name: [] for name in engines}
    order = list(engines)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            eng = engines[name][0]
            w = []
            for _ in range(args.steps):
                c0, t0 = time.thread_time(), time.perf_counter()
                eng.step()
                w.append(time.perf_counter() - t0)
                cpus[name].append(time.thread_time() - c0)
            walls[name] += w
            rounds[name].append(statistics.median(w))
    results = {}
    for name, (eng, held) in engines.items():
        ms = statistics.median(walls[name]) * 1e3
        best = min(rounds[name]) * 1e3
        results[name] = {"held_bytes": held, "held_x_gguf": round(held / gguf_bytes, 3),
                         "ms_per_step": round(ms, 2), "tok_per_s": round(1e3 / ms, 2),
                         "best_round_ms": round(best, 2), "best_round_tok_per_s": round(1e3 / best, 2),
                         "main_thread_cpu_ms": round(statistics.median(cpus[name]) * 1e3, 2)}
        if prefill[name]:
            results[name]["prefill_ms"] = round(statistics.median(prefill[name]) * 1e3, 1)
        print(f"{name}: held {held / 1e6:7.1f} MB ({held / gguf_bytes:.2f}x GGUF tensor bytes "
              f"{gguf_bytes / 1e6:.1f} MB) | {ms:7.2f} ms/step = {1e3 / ms:6.2f} tok/s (median) | "
              f"best round {best:7.2f} ms = {1e3 / best:6.2f} tok/s | main-thread cpu "
              f"{results[name]['main_thread_cpu_ms']:.2f} ms | prefill "
              f"{results[name].get('prefill_ms', '-')} ms")
    print(f"load average after {os.getloadavg()}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
