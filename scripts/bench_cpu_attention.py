"""CPU paged decode attention alone: microseconds per layer for one decode row (and a
5-row verification) at several context lengths, on the bundle models' head shapes.

Usage::

    python scripts/bench_cpu_attention.py                       # fp32 cache, 2 threads
    python scripts/bench_cpu_attention.py --lengths 512 4096 --dtype bfloat16 --threads 1

For each shape (query heads / kv heads / head_dim of SmolLM2-135M, Qwen2.5-Coder-0.5B and
1.5B) and context length, a random KV cache in the paged layout (16-token blocks, in order),
``cpu.paged_attention_decode`` for one query row and ``cpu.paged_attention_verify`` for five
(a draft of four), best of ``--rounds`` rounds of ``--calls`` calls, rounds interleaved over
the shapes. Prints us per layer, the decode's GFLOP/s (``4 * heads * tokens * head_dim``) and
its K/V read rate in GB/s. To compare two builds of the kernels, run it from each checkout
(each loads the kernel build of its own sources).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

SHAPES = {"smollm2-135m": (9, 3, 64), "qwen2.5-coder-0.5b": (14, 2, 64),
          "qwen2.5-coder-1.5b": (12, 2, 128)}  # (heads, kv heads, head_dim)
BLOCK = 16


def case(length: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype, rows: int):
    """``(query [rows, H, D], key_cache, value_cache, block_tables [1, n])`` for one sequence
    of ``length`` tokens."""
    gen = torch.Generator().manual_seed(length + heads)
    blocks = -(-length // BLOCK)
    kc = torch.randn(blocks, BLOCK, kv_heads, dim, generator=gen).to(dtype)
    vc = torch.randn(blocks, BLOCK, kv_heads, dim, generator=gen).to(dtype)
    query = torch.randn(rows, heads, dim, generator=gen).to(dtype)
    return query, kc, vc, torch.arange(blocks).unsqueeze(0)


def best_us(call, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    from localchat.kernels import cpu

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    if not cpu.available():
        sys.exit("bench_cpu_attention: the C++ CPU kernels are not built")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    calls = {}
    for name, (heads, kv_heads, dim) in SHAPES.items():
        scale = dim ** -0.5
        for length in args.lengths:
            q, kc, vc, bt = case(length, heads, kv_heads, dim, dtype, 1)
            sl = torch.tensor([length])
            q5, *_ = case(length, heads, kv_heads, dim, dtype, 5)
            qsl = torch.tensor([0, 5])
            calls[name, length, "decode"] = (
                lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl, s=scale:
                cpu.paged_attention_decode(q, kc, vc, bt, sl, s))
            calls[name, length, "verify 5"] = (
                lambda q=q5, kc=kc, vc=vc, bt=bt, sl=sl, qsl=qsl, s=scale:
                cpu.paged_attention_verify(q, kc, vc, qsl, sl, bt, s))
    best = {key: float("inf") for key in calls}
    for call in calls.values():
        call()
    for _ in range(args.rounds):
        for key, call in calls.items():
            best[key] = min(best[key], best_us(call, args.calls))
    size = torch.finfo(dtype).bits // 8
    print(f"# paged decode attention, {args.dtype} cache, {args.threads} threads, best of "
          f"{args.rounds} x {args.calls} calls, us per layer")
    print("| model (heads / kv / dim) | tokens | decode us | GFLOP/s | K/V GB/s | verify 5 us "
          "| verify / decode |")
    print("|---|---|---|---|---|---|---|")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for length in args.lengths:
            dec, ver = best[name, length, "decode"], best[name, length, "verify 5"]
            flops = 4 * heads * length * dim
            kv = 2 * kv_heads * length * dim * size
            print(f"| {name} ({heads} / {kv_heads} / {dim}) | {length} | {dec:.0f} | "
                  f"{flops / dec / 1e3:.1f} | {kv / dec / 1e3:.1f} | {ver:.0f} | "
                  f"{ver / dec:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
