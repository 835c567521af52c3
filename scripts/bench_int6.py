"""int6 (GGUF Q6_K held exactly, ``kernels/cpu/qa6.h``) vs today's int8 g16 layout for the
Q6_K tensors of Qwen2.5-Coder-1.5B: ``int6_matmul_a8`` against ``int8_matmul_a8`` on the same
values (``gguf_repack`` of the same bytes: int8 ``q = u - 32`` with fp32 ``d * sc`` per 16
columns), decode-sized M, in one process with the two interleaved round by round.

Workload: blk.0.ffn_down (N x K = 1536 x 8960) and output.weight (the LM head, 151936 x 1536),
M = 1 and 5 bf16 activation rows, ``torch.set_num_threads(--threads)``. Each figure is the median
of ``--repeats`` calls (``time.perf_counter``) after a warm-up; GB/s = the layout's weight bytes
/ time (every call reads every weight byte once). Prints the load average first (a busy
machine makes the figures noise), then a table and JSON.

``--fp32`` adds the exact fp32-activation ops (``int6_matmul`` vs ``int8_matmul``, fp32 rows) and
the prefill dequantization (``int6_dequantize`` vs ``int8_dequantize`` into bf16).

Usage: ``python scripts/bench_int6.py [--threads N] [--repeats N] [--model PATH] [--fp32]``
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

DEFAULT_MODEL = (Path.home() / ".cache" / "localchat" / "models" / "qwen2.5-coder-1.5b"
                 / "Qwen2.5-Coder-1.5B-Instruct.gguf")
TENSORS = ("blk.0.ffn_down.weight", "output.weight")


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=0, help="0: 60 (ffn_down) / 12 (LM head)")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--fp32", action="store_true", help="also the fp32 matmuls and dequantize")
    args = ap.parse_args(argv)

    import gguf

    from localchat.kernels import cpu

    if not cpu.available():
        print("CPU kernels not built", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}, threads {args.threads}, isa "
          f"{cpu.isa_name()} (VNNI {cpu.has_vnni()})")
    reader = gguf.GGUFReader(args.model)
    by_name = {t.name: t for t in reader.tensors}
    rows, results = [], []
    for name in TENSORS:
        t = by_name[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q6_K, name
        k, n = (int(s) for s in t.shape)
        raw = torch.from_numpy(np.array(t.data).reshape(-1))
        i6 = (torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // 4, dtype=torch.uint8),
              torch.empty(n, k // 16, dtype=torch.int8),
              torch.empty(n, k // 256, dtype=torch.float16))
        cpu.gguf_repack_q6(raw, *i6)
        q8, s8 = torch.empty(n, k, dtype=torch.int8), torch.empty(n, k // 16)
        cpu.gguf_repack(raw, 14, q8, s8)
        del raw
        b6 = sum(x.nbytes for x in i6)
        b8 = q8.nbytes + s8.nbytes
        repeats = args.repeats or (60 if n * k < 50_000_000 else 12)
        for m in (1, 5):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
            # the same values: the two outputs agree to the fp32 summation order
            a = cpu.int6_matmul_a8(x, *i6).float()
            b = cpu.int8_matmul_a8(x, q8, s8, None, 16).float()
            rel = float((a - b).abs().max() / b.abs().max())
            t6, t8 = [], []
            for _ in range(3):  # interleaved rounds
                t6.append(_median_ms(lambda x=x, w=i6: cpu.int6_matmul_a8(x, *w), repeats))
                t8.append(_median_ms(lambda x=x, q=q8, s=s8: cpu.int8_matmul_a8(x, q, s, None, 16),
                                     repeats))
            ms6, ms8 = min(t6), min(t8)
            res = {"tensor": name, "N": n, "K": k, "M": m,
                   "int6_bytes": b6, "int8g16_bytes": b8,
                   "int6_ms": round(ms6, 3), "int8g16_ms": round(ms8, 3),
                   "int6_GBps": round(b6 / ms6 / 1e6, 2), "int8g16_GBps": round(b8 / ms8 / 1e6, 2),
                   "speedup": round(ms8 / ms6, 3), "max_rel_diff": rel}
            results.append(res)
            rows.append(f"{name:22s} {n:>6d}x{k:<5d} M={m}  int6 {ms6:8.3f} ms "
                        f"{b6 / ms6 / 1e6:6.2f} GB/s ({b6 / 1e6:7.1f} MB) | int8g16 {ms8:8.3f} ms "
                        f"{b8 / ms8 / 1e6:6.2f} GB/s ({b8 / 1e6:7.1f} MB) | x{ms8 / ms6:.2f}")
        if args.fp32:
            for m in (1, 5):
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                ms6 = _median_ms(lambda x=x, w=i6: cpu.int6_matmul(x, *w), repeats)
                ms8 = _median_ms(lambda x=x, q=q8, s=s8: cpu.int8_matmul(x, q, s, None, 16),
                                 repeats)
                results.append({"tensor": name, "op": "fp32 matmul", "M": m,
                                "int6_ms": round(ms6, 3), "int8g16_ms": round(ms8, 3)})
                rows.append(f"{name:22s} fp32 matmul M={m}  int6 {ms6:8.3f} ms "
                            f"{b6 / ms6 / 1e6:6.2f} GB/s | int8g16 {ms8:8.3f} ms "
                            f"{b8 / ms8 / 1e6:6.2f} GB/s | x{ms8 / ms6:.2f}")
            rb = min(n, 4096)  # a prefill block of rows
            o6 = torch.empty(rb, k, dtype=torch.bfloat16)
            o8 = torch.empty(rb, k, dtype=torch.bfloat16)
            p6 = tuple(t[:rb] for t in i6)
            ms6 = _median_ms(lambda w=p6, o=o6: cpu.int6_dequantize(*w, o), repeats)
            ms8 = _median_ms(
                lambda q=q8[:rb], s=s8[:rb], o=o8: cpu.int8_dequantize(q, s, None, 16, o), repeats)
            results.append({"tensor": name, "op": f"dequantize {rb} rows -> bf16",
                            "int6_ms": round(ms6, 3), "int8g16_ms": round(ms8, 3)})
            rows.append(f"{name:22s} dequantize {rb} rows -> bf16  int6 {ms6:8.3f} ms "
                        f"({rb * k / ms6 / 1e6:6.2f} Gw/s) | int8g16 {ms8:8.3f} ms "
                        f"({rb * k / ms8 / 1e6:6.2f} Gw/s)")
        del q8, s8, i6
    print("\n".join(rows))
    print(f"load average after {os.getloadavg()}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
