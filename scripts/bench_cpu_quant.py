"""CPU quantized matmuls: localchat's C++ kernels against PyTorch's own CPU kernels.

For each shape (Qwen2.5-Coder-1.5B's MLP, SmolLM2-135M's MLP and its 49152 x 576 output
layer, ``N x K``) and M in 1, 5, 16
activation rows, in rounds interleaved so the machine's load hits every method alike (the best
of the rounds is kept):

- ``lc int4 a8`` / ``lc int8 a8``: the integer-dot kernels (``cpu.int4_matmul_a8`` /
  ``int8_matmul_a8``; activations quantized to int8 per 32 columns; VNNI, and ``avx2``
  forced; fp16 scales too), what ``localchat.kernels`` runs for bf16 activations by default;
- ``lc int4 g32`` (``localchat.kernels.cpu.int4_matmul``, exact fp32 activations, the CPU
  int4 path for fp32 activations; fp32 and fp16 scales, and ``avx2`` forced),
  against ``torch int4pack`` (``aten._weight_int4pack_mm_for_cpu``, bf16 activations, the
  same weights repacked);
- ``lc int8`` per channel, against ``torch int8pack`` (``aten._weight_int8pack_mm``, bf16);
- ``F.linear`` on the fp32 and bf16 weights.

Printed: ms per call and its ratio to ``torch int4pack`` at the same M; GB/s of weight bytes (packed weight + fp32 scales/mins) at M = 1; the time
at M = 5 over the time at M = 1 (what verifying 4 draft tokens costs relative to one decode
step). On this project's shared 2-core machine the absolute figures are noisy; read the ratios.

Usage: ``python scripts/bench_cpu_quant.py [--threads 2] [--rounds 5] [--quick]
[--cpu-time]`` (``--cpu-time --threads 1``: this thread's CPU time, fair under load)
(also ``python scripts/bench_kernels.py --cpu-quant``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(8960, 1536), (1536, 8960), (1536, 576), (576, 1536), (49152, 576)]  # (N, K)
ROWS = (1, 5, 16)


def _methods(n: int, k: int, m_rows: int):
    from localchat.engine.quant.int4 import to_cpu_int4pack
    from localchat.kernels import cpu

    gen = torch.Generator().manual_seed(0)
    g = 32
    q4 = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s4 = torch.rand(n, k // g, generator=gen) * 0.01 + 1e-3
    m4 = -8 * s4
    packed, sz = to_cpu_int4pack(q4, s4, -m4 / s4)
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    s8 = torch.rand(n, generator=gen) * 0.01
    s8b = s8.bfloat16()
    wf = torch.randn(n, k, generator=gen)
    wb = wf.bfloat16()
    x = torch.randn(m_rows, k, generator=gen)
    xb = x.bfloat16()
    best = cpu.best_isa()
    avx2 = min(best, cpu.ISAS["avx2"])
    int4_bytes = n * k // 2 + 8 * n * (k // g)
    int8_bytes = n * k + 4 * n
    s4h, m4h = s4.half(), m4.half()
    q8g = q8
    s8g = torch.rand(n, k // g, generator=gen) * 0.01
    a8 = "vnni" if best == 2 and cpu.has_vnni() else cpu.isa_name(min(best, 1))
    return {
        f"lc int4 a8 {a8}": (lambda: cpu.int4_matmul_a8(x, q4, s4, m4, g, best), int4_bytes),
        "lc int4 a8 fp16 scales": (lambda: cpu.int4_matmul_a8(x, q4, s4h, m4h, g, best),
                                   n * k // 2 + 4 * n * (k // g)),
        "lc int4 a8 avx2": (lambda: cpu.int4_matmul_a8(x, q4, s4, m4, g, avx2), int4_bytes),
        f"lc int8 g32 a8 {a8}": (lambda: cpu.int8_matmul_a8(x, q8g, s8g, None, g, best),
                                 n * k + 4 * n * (k // g)),
        f"lc int4 g32 {cpu.isa_name(best)}": (lambda: cpu.int4_matmul(x, q4, s4, m4, g, best),
                                              int4_bytes),
        "lc int4 g32 fp16 scales": (lambda: cpu.int4_matmul(x, q4, s4h, m4h, g, best),
                                    n * k // 2 + 4 * n * (k // g)),
        "lc int4 g32 avx2": (lambda: cpu.int4_matmul(x, q4, s4, m4, g, avx2), int4_bytes),
        "torch int4pack g32": (lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            xb, packed, g, sz), int4_bytes),
        f"lc int8 {cpu.isa_name(best)}": (lambda: cpu.int8_matmul(x, q8, s8, None, k, best),
                                          int8_bytes),
        f"lc int8 a8 {a8}": (lambda: cpu.int8_matmul_a8(x, q8, s8, None, k, best), int8_bytes),
        "torch int8pack": (lambda: torch.ops.aten._weight_int8pack_mm(xb, q8, s8b), int8_bytes),
        "F.linear fp32": (lambda: F.linear(x, wf), 4 * n * k),
        "F.linear bf16": (lambda: F.linear(xb, wb), 2 * n * k),
    }


_CLOCK = time.perf_counter  # --cpu-time: time.thread_time (with --threads 1: every op's work)


def _time(fn, reps: int) -> float:
    t0 = _CLOCK()
    for _ in range(reps):
        fn()
    return (_CLOCK() - t0) / reps


def run(threads: int, rounds: int, quick: bool) -> list[dict]:
    from localchat.kernels import cpu

    if not cpu.available():
        print("bench_cpu_quant: error: the CPU kernels are not built", file=sys.stderr)
        raise SystemExit(1)
    torch.set_num_threads(threads)
    shapes = SHAPES[:1] if quick else SHAPES
    print(f"cpu quantized matmul: {threads} threads, torch {torch.__version__}, "
          f"best ISA {cpu.isa_name(cpu.best_isa())}, {rounds} interleaved rounds (best kept)")
    rows = []
    for n, k in shapes:
        per_m = {}
        for m_rows in ROWS:
            meths = _methods(n, k, m_rows)
            for fn, _ in meths.values():
                fn()
                fn()
            best = {name: float("inf") for name in meths}
            for _ in range(rounds):
                for name, (fn, _) in meths.items():
                    best[name] = min(best[name], _time(fn, 5))
            per_m[m_rows] = (best, {name: b for name, (_, b) in meths.items()})
        for name in per_m[1][0]:
            t1 = per_m[1][0][name]
            row = {"shape": f"{n}x{k}", "impl": name, "gbps_m1": per_m[1][1][name] / t1 / 1e9,
                   **{f"ms_m{m}": per_m[m][0][name] * 1e3 for m in ROWS},
                   **{f"vs_pack_m{m}": per_m[m][0][name] / per_m[m][0]["torch int4pack g32"]
                      for m in ROWS},
                   "m5_over_m1": per_m[5][0][name] / t1}
            rows.append(row)
            print(f"  {row['shape']:10s} {name:23s} "
                  + " ".join(f"M={m}: {row[f'ms_m{m}']:7.3f} ms ({row[f'vs_pack_m{m}']:.2f}x)"
                             for m in ROWS)
                  + f"  {row['gbps_m1']:6.1f} GB/s at M=1  M5/M1 {row['m5_over_m1']:.2f}",
                  flush=True)
    print("(x: time over torch int4pack's at the same M, same run)")
    print("| shape N x K | impl | ms M=1 | ms M=5 | ms M=16 | vs int4pack M=1 / M=5 | GB/s M=1 "
          "| M=5 / M=1 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['impl']} | {r['ms_m1']:.3f} | {r['ms_m5']:.3f} | "
              f"{r['ms_m16']:.3f} | {r['vs_pack_m1']:.2f}x / {r['vs_pack_m5']:.2f}x | "
              f"{r['gbps_m1']:.1f} | {r['m5_over_m1']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one shape")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time this thread's CPU time (needs --threads 1): fair on a loaded machine")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.rounds < 1:
        print("bench_cpu_quant: error: --threads and --rounds must be >= 1", file=sys.stderr)
        return 2
    if args.cpu_time:
        if args.threads != 1:
            print("bench_cpu_quant: error: --cpu-time needs --threads 1 (other threads' work "
                  "is not this thread's CPU time)", file=sys.stderr)
            return 2
        global _CLOCK
        _CLOCK = time.thread_time
    run(args.threads, args.rounds, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
