"""int5 (GGUF Q5_0 held exactly, ``kernels/cpu/qa5.h``) vs the int8 g32 layout Q5_0 held before,
for the Q5_0 tensors of Qwen2.5-Coder-0.5B: ``int5_matmul_a8`` against ``int8_matmul_a8`` on
the same values (``gguf_repack`` of the same bytes: int8 ``q = u - 16`` with fp16 ``d`` per 32
columns), decode-sized M, in one process with the two interleaved round by round.

Workload: blk.0.ffn_gate (N x K = 4864 x 896), blk.0.attn_q (896 x 896) and a gate_up-sized
stack of both MLP tensors (9728 x 896, what ``gate_up_proj`` multiplies), M = 1 and 5 bf16
activation rows, ``torch.set_num_threads(--threads)``. Each figure is the best of three
interleaved medians of ``--repeats`` calls (``time.perf_counter``) after a warm-up; GB/s = the
layout's weight bytes / time (every call reads every weight byte once). Prints the load
average first (a busy machine makes the figures noise), then a table and JSON.

``--fp32`` adds the exact fp32-activation ops (``int5_matmul`` vs ``int8_matmul``, fp32 rows) and
the prefill dequantization (``int5_dequantize`` vs ``int8_dequantize`` into bf16).

Usage: ``python scripts/bench_int5.py [--threads N] [--repeats N] [--model PATH] [--fp32]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

DEFAULT_MODEL = (Path.home() / ".cache" / "localchat" / "models" / "qwen2.5-coder-0.5b"
                 / "Qwen2.5-Coder-0.5B-Instruct.gguf")
Q5_0 = 6


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _tensors(path: Path) -> list[tuple[str, np.ndarray, int, int]]:
    """``[(name, raw uint8 [N * row_bytes], N, K)]`` of the workload, read from the mapped file."""
    from localchat.engine.loader.gguf_header import read_gguf_header

    data = np.memmap(path, dtype=np.uint8, mode="r")
    by_name = {t.name: t for t in read_gguf_header(path).tensors}

    def raw(name):
        t = by_name[name]
        assert t.ggml_type == Q5_0, name
        k, n = t.dims
        return np.array(data[t.offset:t.offset + t.n_bytes]), n, k

    gate, n, k = raw("blk.0.ffn_gate.weight")
    up, _, _ = raw("blk.0.ffn_up.weight")
    q, nq, kq = raw("blk.0.attn_q.weight")
    return [("blk.0.ffn_gate.weight", gate, n, k), ("blk.0.attn_q.weight", q, nq, kq),
            ("gate|up (stacked)", np.concatenate([gate, up]), 2 * n, k)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--fp32", action="store_true", help="also the fp32 matmuls and dequantize")
    args = ap.parse_args(argv)

    from localchat.kernels import cpu

    if not cpu.available():
        print("CPU kernels not built", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, threads {args.threads}, isa "
          f"{cpu.isa_name()} (VNNI {cpu.has_vnni()})")
    rows, results = [], []
    for name, raw_np, n, k in _tensors(args.model):
        raw = torch.from_numpy(raw_np)
        i5 = (torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // 8, dtype=torch.uint8),
              torch.empty(n, k // 32, dtype=torch.float16))
        cpu.gguf_repack_q5(raw, *i5)
        q8, s8 = torch.empty(n, k, dtype=torch.int8), torch.empty(n, k // 32, dtype=torch.float16)
        cpu.gguf_repack(raw, Q5_0, q8, s8)
        b5 = sum(x.nbytes for x in i5)
        b8 = q8.nbytes + s8.nbytes
        for m in (1, 5):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
            # the same values: the two outputs agree to the fp32 summation order
            a = cpu.int5_matmul_a8(x, *i5).float()
            b = cpu.int8_matmul_a8(x, q8, s8, None, 32).float()
            rel = float((a - b).abs().max() / b.abs().max())
            t5, t8 = [], []
            for _ in range(3):  # interleaved rounds
                t5.append(_median_ms(lambda x=x, w=i5: cpu.int5_matmul_a8(x, *w), args.repeats))
                t8.append(_median_ms(lambda x=x, q=q8, s=s8: cpu.int8_matmul_a8(x, q, s, None, 32),
                                     args.repeats))
            ms5, ms8 = min(t5), min(t8)
            results.append({"tensor": name, "N": n, "K": k, "M": m,
                            "int5_bytes": b5, "int8g32_bytes": b8,
                            "int5_ms": round(ms5, 4), "int8g32_ms": round(ms8, 4),
                            "int5_GBps": round(b5 / ms5 / 1e6, 2),
                            "int8g32_GBps": round(b8 / ms8 / 1e6, 2),
                            "speedup": round(ms8 / ms5, 3), "max_rel_diff": rel})
            rows.append(f"{name:22s} {n:>5d}x{k:<4d} M={m}  int5 {ms5:7.4f} ms "
                        f"{b5 / ms5 / 1e6:6.2f} GB/s ({b5 / 1e6:5.2f} MB) | int8g32 {ms8:7.4f} ms "
                        f"{b8 / ms8 / 1e6:6.2f} GB/s ({b8 / 1e6:5.2f} MB) | x{ms8 / ms5:.2f}")
        if args.fp32:
            for m in (1, 5):
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                ms5 = _median_ms(lambda x=x, w=i5: cpu.int5_matmul(x, *w), args.repeats)
                ms8 = _median_ms(lambda x=x, q=q8, s=s8: cpu.int8_matmul(x, q, s, None, 32),
                                 args.repeats)
                results.append({"tensor": name, "op": "fp32 matmul", "M": m,
                                "int5_ms": round(ms5, 4), "int8g32_ms": round(ms8, 4)})
                rows.append(f"{name:22s} fp32 matmul M={m}  int5 {ms5:7.4f} ms | int8g32 "
                            f"{ms8:7.4f} ms | x{ms8 / ms5:.2f}")
            o5 = torch.empty(n, k, dtype=torch.bfloat16)
            o8 = torch.empty(n, k, dtype=torch.bfloat16)
            ms5 = _median_ms(lambda w=i5, o=o5: cpu.int5_dequantize(*w, o), args.repeats // 4)
            ms8 = _median_ms(lambda q=q8, s=s8, o=o8: cpu.int8_dequantize(q, s, None, 32, o),
                             args.repeats // 4)
            results.append({"tensor": name, "op": f"dequantize {n} rows -> bf16",
                            "int5_ms": round(ms5, 4), "int8g32_ms": round(ms8, 4)})
            rows.append(f"{name:22s} dequantize -> bf16  int5 {ms5:7.4f} ms | int8g32 "
                        f"{ms8:7.4f} ms | x{ms8 / ms5:.2f}")
    print("\n".join(rows))
    print(f"load average after {os.getloadavg()}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
