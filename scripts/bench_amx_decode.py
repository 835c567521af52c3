"""AMX-INT8 W4A8 kernel (``kernels/cpu/qa8_amx.cpp``, ``LOCALCHAT_CPU_AMX_DECODE=1``) against
the VNNI one it would replace, for decode and verification rows.

1. The op: ``int4_matmul_a8`` on random Q4_K-layout weights (two-level scales) of
   Qwen2.5-Coder-1.5B's int4 shapes (gate/up 17920 x 1536, down 1536 x 8960, qkv 2048 x
   1536), M = 1, 2, 5, 8, 16 bf16 rows, the two levels interleaved; enough distinct weight
   copies per shape that each call streams from memory as in a model. Best of ``--repeats``
   passes (``time.perf_counter``), ms per call, and each M's time over M = 1's.
2. The model (``--model``, default the 1.5B, native weights, bf16): teacher-forced forwards
   of 1, 5 and 8 rows over a 40-token text with the switch off and on, in alternated rounds;
   ms per forward (best round) and the 5- and 8-row forward over the 1-row one.

Needs a CPU with AMX-INT8 (``cpu.has_amx_int8()``); exits with one line otherwise.

Usage: ``python scripts/bench_amx_decode.py [--threads N] [--repeats N] [--model NAME]
[--rounds N] [--no-model]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

SHAPES = {"gate_up 17920x1536": (17920, 1536), "down 1536x8960": (1536, 8960),
          "qkv 2048x1536": (2048, 1536)}
ROWS = (1, 2, 5, 8, 16)


def _q4k(n: int, k: int, gen: torch.Generator):
    return (torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8),
            torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
            torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
            (torch.rand(n, k // 256, 2, generator=gen) * 0.01).half())


def bench_op(repeats: int) -> dict:
    from localchat.kernels import cpu

    op = torch.ops.localchat_cpu.int4_matmul_a8
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, (n, k) in SHAPES.items():
        copies = [_q4k(n, k, gen) for _ in range(max(2, int(120e6 // (n * k // 2))))]
        for m in ROWS:
            x = torch.randn(m, k, generator=gen).bfloat16()
            levels = (2, cpu.AMX_INT8_LEVEL)
            best = dict.fromkeys(levels, float("inf"))
            for _ in range(repeats):
                for level in levels:
                    t0 = time.perf_counter()
                    for q, sc, mn, sup in copies:
                        op(x, q, sc, mn, 32, level, sup)
                    best[level] = min(best[level], (time.perf_counter() - t0) / len(copies))
            out[(name, m)] = (best[2] * 1e3, best[cpu.AMX_INT8_LEVEL] * 1e3)
    print(f"{'shape':20} {'M':>3} {'VNNI ms':>9} {'AMX ms':>9} {'VNNI /M1':>9} {'AMX /M1':>9}")
    for (name, m), (v, a) in out.items():
        v1, a1 = out[(name, 1)]
        print(f"{name:20} {m:>3} {v:>9.3f} {a:>9.3f} {v / v1:>9.2f} {a / a1:>9.2f}")
    return {f"{n} M{m}": {"vnni_ms": v, "amx_ms": a} for (n, m), (v, a) in out.items()}


def bench_model(name: str, rounds: int) -> dict:
    from localchat import kernels
    from localchat.app.settings import cache_dir as settings_cache_dir
    from localchat.engine.config import QuantConfig
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.loader import load_model, load_model_config
    from localchat.engine.quant.evaluate import EVAL_TEXT, teacher_forced_logits
    from localchat.engine.tokenizer import Tokenizer
    from localchat.kernels import cpu

    cache = settings_cache_dir()
    path = resolve_model(name, cache_dir=cache).path
    model = load_model(path, load_model_config(path, cache), dtype=torch.bfloat16,
                       device=torch.device("cpu"), max_position=512, cache_dir=cache,
                       quant=QuantConfig(scheme="native"))
    ids = Tokenizer.from_pretrained(path, cache_dir=cache).encode(EVAL_TEXT)[:40]
    times: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for flag in ("0", "1"):
            os.environ[cpu.amx.AMX_DECODE_ENV] = flag
            kernels.refresh_env()
            for chunk in (1, 5, 8):
                with torch.inference_mode():
                    teacher_forced_logits(model, ids[:10], chunk=chunk)
                    t0 = time.perf_counter()
                    teacher_forced_logits(model, ids, chunk=chunk)
                per = (time.perf_counter() - t0) / -(-len(ids) // chunk)
                times[(flag, chunk)] = min(times.get((flag, chunk), float("inf")), per)
    result = {}
    for flag, label in (("0", "VNNI"), ("1", "AMX")):
        f1, f5, f8 = (times[(flag, c)] * 1e3 for c in (1, 5, 8))
        print(f"{name} {label:>4}: forward 1 row {f1:.1f} ms, 5 rows {f5:.1f} ms "
              f"({f5 / f1:.2f}x), 8 rows {f8:.1f} ms ({f8 / f1:.2f}x)")
        result[label] = {"fwd1_ms": f1, "fwd5_ms": f5, "fwd8_ms": f8}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-model", action="store_true", help="the op table only")
    args = ap.parse_args()
    from localchat.kernels import cpu

    if not (cpu.available() and cpu.has_amx_int8()):
        print("bench_amx_decode: this CPU has no AMX-INT8 (or no C++ kernels)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} threads")
    report = {"op": bench_op(args.repeats)}
    if not args.no_model:
        report["model"] = bench_model(args.model, args.rounds)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
