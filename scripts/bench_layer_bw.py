"""Decode matmuls from memory: each kind of decoder linear (qkv, o, gate_up, down) of a GGUF
model, one activation row, run over all layers in sequence, so the weights come from DRAM as
in a decode step (one layer alone stays in the L3 cache between calls and reads faster than a
step can); beside them, a streaming read of 512 MiB (``int64`` sum) with the same threads.
Rounds are interleaved; the best round of each is printed with its GB/s (the layers' weight,
scale and min bytes over the time).

Read the layers' GB/s against the streaming read's from the same run: on a shared VM the
bandwidth itself moves between runs (30-54 GB/s on the 2-core Zen 4 of 2026-12-04).

Usage: ``python scripts/bench_layer_bw.py [--model GGUF] [--threads 2] [--rounds 5]``
(the model's own weight format, the engine's default activations for this CPU).
"""

from __future__ import annotations

import argparse
import time

import torch

DEFAULT_MODEL = "~/.cache/localchat/models/qwen2.5-coder-1.5b/Qwen2.5-Coder-1.5B-Instruct.gguf"
STREAM_BYTES = 512 << 20


def _nbytes(module: torch.nn.Module) -> int:
    return sum(t.nbytes for t in [*module.parameters(), *module.buffers()])


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from localchat.engine.config import EngineConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eng = LLMEngine.from_path(Path(args.model).expanduser(),
                              EngineConfig(scheduler=SchedulerConfig(max_model_len=512)))
    layers = eng.runner.model.model.layers
    c = eng.model_config
    kinds = {"qkv": ([l.self_attn.qkv_proj for l in layers], c.hidden_size),
             "o": ([l.self_attn.o_proj for l in layers], c.num_attention_heads * c.head_dim),
             "gate_up": ([l.mlp.gate_up_proj for l in layers], c.hidden_size),
             "down": ([l.mlp.down_proj for l in layers], c.intermediate_size)}
    stream = torch.ones(STREAM_BYTES // 8, dtype=torch.int64)
    times: dict[str, list[float]] = {k: [] for k in [*kinds, "stream"]}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, (mods, width) in kinds.items():
                x = torch.randn(1, width, dtype=eng.dtype)
                t0 = time.perf_counter()
                for mod in mods:
                    mod(x)
                times[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            stream.sum()
            times["stream"].append(time.perf_counter() - t0)
    print(f"{args.model}: {len(layers)} layers, {eng.dtype}, {args.threads} threads, best of "
          f"{args.rounds} interleaved rounds")
    for name, ts in times.items():
        size = STREAM_BYTES if name == "stream" else sum(_nbytes(m) for m in kinds[name][0])
        best = min(ts)
        print(f"{name:8s} {size / 1e6:8.1f} MB  {best * 1e3:8.3f} ms  "
              f"{size / best / 1e9:6.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
