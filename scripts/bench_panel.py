"""The panel layouts (``kernels/cpu/panel4.h``, ``panel5.h``, ``panel6.h``, ``panel8.h``)
against the row layouts' integer-dot kernels (``kernels/cpu/qa8_*.cpp``, ``qa5_*.cpp``,
``qa6_*.cpp``) on the same weights: two-level int4 (Q4_K), int6 (Q6_K), one-level int4
(Q4_1), int5 (Q5_0) and int8 (Q8_0).

Workload: Qwen2.5-Coder-1.5B's shapes: Q4_K gate/up 17920 x 1536, down 1536 x 8960, q/o
1536 x 1536; Q6_K down 1536 x 8960 and the output layer 151936 x 1536; SmolLM2-135M's Q4_1
gate/up 3072 x 576, down 576 x 1536 and q/o 576 x 576; the Q8_0 output layers of SmolLM2
(49152 x 576, tied) and Qwen2.5-Coder-0.5B (151936 x 896); the 0.5B's Q5_0 gate/up
4864 x 896 and q/o 896 x 896. Random bytes (the kernels' cost
does not depend on the values), ``--layers`` copies of each (one of an output layer) so that
a round streams them from memory as a decode step does (one layer alone would stay in the L3
cache); ``--rows`` bf16 activation rows (1, 5, 16 and 64);
``torch.set_num_threads(--threads)``. Each round times one call per copy for each layout,
the two layouts alternating; the best of ``--rounds`` rounds per (shape, M, layout) is
printed as ms per layer and GB/s (weight, scale and min bytes / time), with the ratio
row / panel. Prints the load average first: on a shared machine compare rows of one run only.

Usage: ``python scripts/bench_panel.py [--threads 2] [--rounds 5] [--layers 28]
[--kinds int4 int6 q4_1 q5_0 q8_0] [--rows 1 5 16 64]``
"""

from __future__ import annotations

import argparse
import os
import time

import torch

# kind -> {shape name: (N, K, copies or None for --layers)}
SHAPES = {"int4": {"gate_up": (17920, 1536, None), "down": (1536, 8960, None),
                   "q/o": (1536, 1536, None)},
          "int6": {"down": (1536, 8960, None), "output": (151936, 1536, 1)},
          "q4_1": {"gate_up": (3072, 576, None), "down": (576, 1536, None),
                   "q/o": (576, 576, None)},
          "q5_0": {"gate_up": (4864, 896, None), "q/o": (896, 896, None)},
          "q8_0": {"output": (49152, 576, 1), "output_0.5b": (151936, 896, 1)}}
ROWS = (1, 5, 16, 64)


def _int4_weights(n: int, k: int, gen: torch.Generator):
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    sc = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    mn = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    sup = (torch.rand(n, k // 256, 2, generator=gen) * 0.01).half()
    return q, sc, mn, sup


def _int6_weights(n: int, k: int, gen: torch.Generator):
    ql = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    qh = torch.randint(0, 256, (n, k // 4), generator=gen, dtype=torch.uint8)
    sc = torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8)
    sup = (torch.rand(n, k // 256, generator=gen) * 0.01).half()
    return ql, qh, sc, sup


def _q4_1_weights(n: int, k: int, gen: torch.Generator):
    q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    sc = (torch.rand(n, k // 32, generator=gen) * 0.01).half()
    return q, sc, (-8 * sc.float()).half()


def _q5_0_weights(n: int, k: int, gen: torch.Generator):
    ql = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    qh = torch.randint(0, 256, (n, k // 8), generator=gen, dtype=torch.uint8)
    return ql, qh, (torch.rand(n, k // 32, generator=gen) * 0.01).half()


def _q8_0_weights(n: int, k: int, gen: torch.Generator):
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    return q, (torch.rand(n, k // 32, generator=gen) * 0.01).half()


def _kinds():
    """kind -> (weights, to panel, row-layout call, panel call)."""
    from localchat.engine.quant.int4_panel import to_panel
    from localchat.engine.quant.int5_panel import to_panel5
    from localchat.engine.quant.int6_panel import to_panel6
    from localchat.engine.quant.int8_panel import to_panel8
    from localchat.kernels import cpu

    return {"int4": (_int4_weights, to_panel,
                     lambda x, w: cpu.int4_matmul_a8(x, w[0], w[1], w[2], 32, super_scales=w[3]),
                     lambda x, p: cpu.int4_panel_a8(x, *p)),
            "int6": (_int6_weights, to_panel6, lambda x, w: cpu.int6_matmul_a8(x, *w),
                     lambda x, p: cpu.int6_panel_a8(x, *p)),
            "q4_1": (_q4_1_weights, to_panel, lambda x, w: cpu.int4_matmul_a8(x, *w, 32),
                     lambda x, p: cpu.int4_panel_a8(x, *p)),
            "q5_0": (_q5_0_weights, to_panel5, lambda x, w: cpu.int5_matmul_a8(x, *w),
                     lambda x, p: cpu.int5_panel_a8(x, *p)),
            "q8_0": (_q8_0_weights, to_panel8,
                     lambda x, w: cpu.int8_matmul_a8(x, w[0], w[1], None, 32),
                     lambda x, p: cpu.int8_panel_a8(x, *p))}


def main(argv: list[str] | None = None) -> int:
    from localchat.kernels import cpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kinds", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    args = ap.parse_args(argv)
    if not cpu.available():
        print("the C++ CPU kernels are not built: nothing to compare")
        return 1
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.threads} threads, best of "
          f"{args.rounds} alternating rounds, {args.layers} copies per shape; VNNI: "
          f"{cpu.has_vnni()}")
    print("| shape | M | row ms | row GB/s | panel ms | panel GB/s | row / panel |")
    print("|---|---|---|---|---|---|---|")
    kinds = _kinds()
    for kind in args.kinds:
        make, convert, row_call, panel_call = kinds[kind]
        for name, (n, k, copies) in SHAPES[kind].items():
            copies = copies or args.layers
            rows = [make(n, k, gen) for _ in range(copies)]
            panels = [convert(*w) for w in rows]
            nbytes = sum(t.nbytes for t in rows[0])
            for m in args.rows:
                x = torch.randn(m, k, generator=gen).bfloat16()
                best = {"row": float("inf"), "panel": float("inf")}
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    for w in rows:
                        row_call(x, w)
                    t1 = time.perf_counter()
                    for p in panels:
                        panel_call(x, p)
                    t2 = time.perf_counter()
                    best["row"] = min(best["row"], (t1 - t0) / copies)
                    best["panel"] = min(best["panel"], (t2 - t1) / copies)
                r, p = best["row"], best["panel"]
                print(f"| {kind} {name} {n} x {k} | {m} | {r * 1e3:.3f} | "
                      f"{nbytes / r / 1e9:.1f} | {p * 1e3:.3f} | {nbytes / p / 1e9:.1f} | "
                      f"{r / p:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
