"""AMX prefill GEMM (``localchat.kernels.cpu.int{4,5,6,8}_dequant_mm``) against the row blocks +
``torch.mm`` route it replaces for short prefills (``engine/quant/cpu_prefill.blockwise_mm``),
on the same random weights in the layouts and shapes of Qwen2.5-Coder-1.5B (Q4_K gate/up and
down, Q6_K down) and -0.5B (Q5_0, Q8_0), bf16 activations of 17 to 512 rows, interleaved in
one process. Each figure is the minimum of ``--repeats`` calls (``time.perf_counter``) after a
warm-up; the ratio is the row blocks' time over the AMX kernel's (> 1: AMX faster). Prints
the load average first (a busy machine makes the figures noise), then a table and JSON.

Needs a CPU with AMX (``cpu.has_amx()``); exits with one line otherwise.

Usage: ``python scripts/bench_amx_prefill.py [--threads N] [--repeats N] [--rows 17 64 ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch


def _min_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def _random_blocks(n: int, k: int, block_bytes: int, block_cols: int, d_at: int,
                   seed: int) -> np.ndarray:
    """Random GGUF block bytes with a finite fp16 ``d`` at byte ``d_at`` of each block."""
    rng = np.random.default_rng(seed)
    nb = n * k // block_cols
    raw = rng.integers(0, 256, size=(nb, block_bytes), dtype=np.uint8)
    d = (rng.uniform(1e-3, 1e-2, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
    raw[:, d_at:d_at + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, -1)


def layers(cpu):
    """(name, N, K, amx(x), fill(a, b, w)) for each benchmarked layer."""
    from localchat.engine.quant.int5_layout import repack_q5_0
    from localchat.engine.quant.int6_layout import repack_q6_k

    gen = torch.Generator().manual_seed(0)
    out = []
    for n, k in ((17920, 1536), (1536, 8960)):
        q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
        sc = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
        mn = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
        sup = (torch.rand(n, k // 256, 2, generator=gen) * 0.01).half()
        out.append((f"Q4_K {n}x{k}", n, k,
                    lambda x, q=q, sc=sc, mn=mn, sup=sup: cpu.int4_dequant_mm(x, q, sc, mn, 32,
                                                                               sup),
                    lambda a, b, w, q=q, sc=sc, mn=mn, sup=sup: cpu.int4_dequantize(
                        q[a:a + b], sc[a:a + b], mn[a:a + b], 32, w, sup[a:a + b])))
    n, k = 1536, 8960
    p6 = tuple(torch.from_numpy(t) for t in repack_q6_k(_random_blocks(n, k, 210, 256, 208, 1),
                                                         n, k))
    out.append((f"Q6_K {n}x{k}", n, k, lambda x: cpu.int6_dequant_mm(x, *p6),
                lambda a, b, w: cpu.int6_dequantize(*(t[a:a + b] for t in p6), w)))
    n, k = 4864, 896
    p5 = tuple(torch.from_numpy(t) for t in repack_q5_0(_random_blocks(n, k, 22, 32, 0, 2),
                                                        n, k))
    out.append((f"Q5_0 {n}x{k}", n, k, lambda x: cpu.int5_dequant_mm(x, *p5),
                lambda a, b, w: cpu.int5_dequantize(*(t[a:a + b] for t in p5), w)))
    q8 = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s8 = (torch.rand(n, k // 32, generator=gen) * 0.01).half()
    out.append((f"Q8_0 {n}x{k}", n, k, lambda x: cpu.int8_dequant_mm(x, q8, s8, None, 32),
                lambda a, b, w: cpu.int8_dequantize(q8[a:a + b], s8[a:a + b], None, 32, w)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=int, nargs="+", default=[17, 64, 128, 256, 512])
    args = ap.parse_args(argv)
    from localchat.engine.quant import cpu_prefill
    from localchat.kernels import cpu

    if not (cpu.available() and cpu.has_amx()):
        print("bench_amx_prefill: this CPU has no usable AMX bf16 tiles (or no C++ kernels)",
              file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, threads {args.threads}")
    rows = []
    for name, n, k, amx, fill in layers(cpu):
        for m in args.rows:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
            blocks = _min_ms(lambda: cpu_prefill.blockwise_mm(x, n, k, fill), args.repeats)
            tiles = _min_ms(lambda: amx(x), args.repeats)
            rows.append({"layer": name, "M": m, "amx_ms": round(tiles, 3),
                         "blocks_ms": round(blocks, 3), "ratio": round(blocks / tiles, 2)})
            print(f"{name:16s} M={m:4d}  amx {tiles:8.2f} ms  row blocks {blocks:8.2f} ms"
                  f"  x{blocks / tiles:.2f}", flush=True)
    print(f"load average after {os.getloadavg()}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
