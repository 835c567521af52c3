"""Host overhead of one decode step, measured on a SmolLM2-shaped twin that computes ~nothing.

Usage::

    python scripts/bench_host.py                            # int4 weights, bf16, 1 thread
    python scripts/bench_host.py --quant none --dtype float32 --rounds 8

The twin has SmolLM2-135M's structure (30 layers, tied embeddings, grouped-query attention,
so the same ops through the same kernels and the same Python per layer) at tiny widths
(hidden 128, 8 query / 2 KV heads of 16 dims, intermediate 256, vocab 512; random weights,
saved once to ``--folder``), so an op's arithmetic is negligible and a decode step's time is
what the host spends: Python (scheduler, batch building, per-layer glue, kernel dispatch,
sampling, detokenizer, outputs) plus each ATen/custom op's dispatch. Per round: a 256-token
prompt, 10 warm-up decode steps, then ``--steps`` measured ``LLMEngine.step()`` calls
(greedy, batch 1). Printed: the main thread's CPU time per step (``time.thread_time``,
median per round; CPU time is what a busy shared machine inflates least) and the wall time,
as the median and the minimum over ``--rounds``, and the ATen op count per step.

``bench_step.py`` measures the real SmolLM2 (wall, forward, ATen time); this one isolates the
host's part. The machine is shared and noisy: compare two runs made one after the other
(a branch against ``main``), never against a figure from another session.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.tokenizer import Tokenizer

SMOLLM2 = (Path.home() / ".cache/localchat/models/smollm2-135m"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
MAX_LEN = 2048


def make_twin(folder: Path) -> None:
    """Save the random SmolLM2-shaped twin (HF safetensors) into ``folder`` once."""
    if (folder / "config.json").exists():
        return
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=MAX_LEN, tie_word_embeddings=True,
                         rms_norm_eps=1e-5)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder),
                                                             safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="int4")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--folder", type=Path, default=Path.home() / ".cache/localchat/bench-twin")
    ap.add_argument("--tokenizer", type=Path, default=SMOLLM2,
                    help="any model file or folder with a tokenizer (ids < 512 are decoded)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    make_twin(args.folder)
    dtype = getattr(torch, args.dtype)
    quant = QuantConfig(scheme=args.quant)
    tok = Tokenizer.from_pretrained(args.tokenizer, cache_dir=Path.home() / ".cache/localchat")
    mc = load_model_config(args.folder)
    model = load_model(args.folder, mc, dtype=dtype, device=torch.device("cpu"),
                       max_position=MAX_LEN, quant=quant)
    eng = LLMEngine(model, mc, tok, EngineConfig(
        device="cpu", dtype=dtype, quant=quant,
        scheduler=SchedulerConfig(max_model_len=MAX_LEN)), MAX_LEN)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    cpu_ms, wall_ms = [], []
    for _ in range(args.rounds):
        eng.reset_prefix_cache()
        rid = eng.add_request(None, list(range(100, 356)), params)
        for _ in range(11):  # the prefill and 10 warm-up steps
            eng.step()
        cpu, wall = [], []
        for _ in range(args.steps):
            c0, t0 = time.thread_time(), time.perf_counter()
            eng.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        eng.abort_request(rid)
        cpu_ms.append(statistics.median(cpu) * 1e3)
        wall_ms.append(statistics.median(wall) * 1e3)
    from torch.profiler import ProfilerActivity, profile

    rid = eng.add_request(None, list(range(100, 356)), params)
    for _ in range(11):
        eng.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(8):
            eng.step()
    eng.abort_request(rid)
    events = prof.events()
    top = sum(1 for e in events if e.cpu_parent is None)
    print(f"twin of SmolLM2 (30 layers, hidden 128) quant={args.quant} dtype={args.dtype} "
          f"threads={args.threads} rounds={args.rounds} x {args.steps} steps")
    print(f"host cpu ms/step   median {statistics.median(cpu_ms):7.3f}  min {min(cpu_ms):7.3f}"
          "  (main thread, time.thread_time)")
    print(f"wall ms/step       median {statistics.median(wall_ms):7.3f}  min {min(wall_ms):7.3f}")
    print(f"aten ops/step      {len(events) / 8:7.1f}  (top-level {top / 8:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
