"""CPU float-weight matmul at decode shapes: localchat's batch-invariant C++ kernel against
``F.linear`` / ``torch.mm``.

For each shape (``N x K``: SmolLM2-135M's 49152 x 576 output layer and 960 x 576 qkv,
Qwen2.5-Coder-1.5B's 151936 x 1536 output layer and 1536 x 8960 down projection) and M in 1
and 5 rows (a decode step; verifying 4 drafts), in rounds interleaved so the machine's load hits
every method alike (the best round is kept):

- bf16 weights and activations: ``F.linear`` (oneDNN) against ``cpu.float_matmul`` (FMA
  tiles; ``dot``: the same sums with AVX512_BF16's ``vdpbf16ps`` where the CPU has it);
- fp32 (``--fp32``): ``torch.mm`` over the layers' ``weight_t [K, N]`` (what the fp32 CPU
  layers call) against ``cpu.float_matmul_t`` over the same tensor.

Printed: ms per call, GB/s of weight bytes, and the ratio baseline / ours (> 1: ours faster).
On this project's shared 2-core machine absolute figures are noisy; read the ratios.

Usage: ``python scripts/bench_float_matmul.py [--threads 2] [--rounds 5] [--fp32] [--cpu-time]``
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(49152, 576), (960, 576), (151936, 1536), (1536, 8960)]  # (N, K)
ROWS = (1, 5)


def best_times(fns: list, reps: int, rounds: int, clock=time.perf_counter) -> list[float]:
    """Best-of-``rounds`` ms per call of each function, the rounds interleaved."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = clock()
            for _ in range(reps):
                fn()
            best[i] = min(best[i], (clock() - start) / reps * 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fp32", action="store_true", help="also the fp32 weight_t layout")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread, CPU time of the calling thread (time.thread_time): a "
                         "fair ratio on a loaded machine")
    args = ap.parse_args(argv)
    clock = time.perf_counter
    if args.cpu_time:
        args.threads, clock = 1, time.thread_time
    from localchat.kernels import cpu

    if not cpu.available():
        print("localchat: error: the CPU kernels are not built", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"{'cpu time' if args.cpu_time else 'wall'}, threads {args.threads}, isa {cpu.isa_name()}, vdpbf16ps "
          f"{cpu.has_bf16_dot()}; best of {args.rounds} rounds")
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        w = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
        reps = max(2, int(2e7 / (n * k)))
        for m in ROWS:
            x = torch.randn(m, k, generator=gen).bfloat16()
            base, ours, dot = best_times([
                lambda: F.linear(x, w), lambda: cpu.float_matmul(x, w),
                lambda: torch.ops.localchat_cpu.float_matmul(x, w, None, cpu.active_isa(),
                                                             True)], reps, args.rounds,
                clock)
            gbs = n * k * 2 / ours / 1e6
            print(f"bf16 {n:6d} x {k:5d} M={m:2d}: F.linear {base:8.3f} ms | ours {ours:8.3f} "
                  f"ms ({gbs:5.1f} GB/s) {base / ours:5.2f}x | dot {dot:8.3f} ms "
                  f"{base / dot:5.2f}x", flush=True)
        if args.fp32 and n * k <= 30_000_000:
            wt = w.float().t().contiguous()
            for m in ROWS:
                x = torch.randn(m, k, generator=gen)
                base, ours = best_times([lambda: torch.mm(x, wt),
                                         lambda: cpu.float_matmul_t(x, wt)], reps, args.rounds,
                                        clock)
                gbs = n * k * 4 / ours / 1e6
                print(f"fp32 {n:6d} x {k:5d} M={m:2d}: torch.mm  {base:8.3f} ms | ours "
                      f"{ours:8.3f} ms ({gbs:5.1f} GB/s) {base / ours:5.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
