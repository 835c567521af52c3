"""GGUF repack benchmark: numpy (the reference) against the C++ op, per GGML type and per file.

Usage::

    python scripts/bench_repack.py                         # the smollm2-135m bundle's GGUF
    python scripts/bench_repack.py ~/.cache/localchat/models/qwen2.5-coder-1.5b/*.gguf \\
        --threads 2 --repeat 3 --json out.json

For every quantized tensor of the file (its bytes read from a memory map of the file, which
should be in the page cache: the first pass warms it), grouped by GGML type; MB/s are the
file's tensor bytes per second:

* numpy MB/s: ``gguf_repack._repack_numpy`` (``_decode`` + the layout steps; the path without
  the C++ kernels), one pass.
* C++ MB/s: ``repack_gguf_tensor`` with the kernels (new output tensors per tensor, as a
  standalone call allocates them: includes their page faults), best of ``--repeat`` passes.
* C++ warm MB/s: the op alone into outputs allocated and touched beforehand (the kernel's own
  speed; the native loader writes into the layers' buffers, allocated once).
* whole file: the sums of those times; ``identical`` says every tensor's C++ result equals the
  numpy one bit for bit (checked on the numpy pass).

The native cold load itself (``scripts/bench_load.py``) adds the tensor table, the layers'
first-touch page faults and the cache write. Figures on the shared 2-core development machine
are noisy (other jobs run beside it); compare columns of one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _default_gguf() -> Path:
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    return Path(resolve_model("smollm2-135m", cache_dir=cache_dir()).path)


def _outputs(ggml_type: int, n: int, k: int):
    from localchat.engine.quant import gguf_repack as gr

    layout = gr.GGML_TYPES[ggml_type][3]
    group, has_mins = gr.repacked_group(ggml_type)
    sd = gr.scale_dtype(ggml_type)
    q = torch.zeros(n, k // 2, dtype=torch.uint8) if layout == "int4" else torch.zeros(
        n, k, dtype=torch.int8)
    s = torch.zeros(n, k // group, dtype=sd)
    return q, s, torch.zeros(n, k // group, dtype=sd) if has_mins else None


def _same(a, b) -> bool:
    for x, y in ((a.qweight, b.qweight), (a.scales, b.scales), (a.mins, b.mins)):
        if (x is None) != (y is None):
            return False
        if x is not None and not (x.dtype == y.dtype and x.shape == y.shape and torch.equal(
                x.view(torch.uint8), y.view(torch.uint8))):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", nargs="?", type=Path, help="GGUF file (default: smollm2-135m)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="C++ passes, best kept")
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy pass")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from localchat.app.settings import cache_dir
    from localchat.engine.loader.gguf import _tensor_index
    from localchat.engine.quant import gguf_repack as gr
    from localchat.kernels import cpu

    torch.set_num_threads(args.threads)
    path = args.gguf or _default_gguf()
    if not cpu.available():
        print("C++ kernels unavailable: nothing to compare", file=sys.stderr)
        return 1
    index = _tensor_index(path, cache_dir())
    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in index["tensors"]:
        if t["type"] in cpu.GGUF_REPACK_TYPES:
            n, k = reversed(t["dims"])
            tensors.append((t, data[t["offset"]:t["offset"] + t["n_bytes"]], (n, k)))
    names = sorted({gr.GGML_TYPES[t["type"]][0] for t, _, _ in tensors})
    print(f"workload: {path.name}, {len(tensors)} quantized tensors, "
          f"{sum(t['n_bytes'] for t, _, _ in tensors) / 1e6:.0f} MB ({', '.join(names)}), "
          f"{args.threads} threads, CPU ISA {cpu.isa_name()}")
    for _, raw, _ in tensors:  # warm the page cache
        int(raw[::4096].sum())

    per: dict[str, dict[str, float]] = {
        n: {"bytes": 0, "numpy_s": 0.0, "cpp_s": float("inf"), "cpp_warm_s": float("inf")}
        for n in names}
    identical = None
    if not args.no_numpy:
        identical = True
        for t, raw, shape in tensors:
            name = gr.GGML_TYPES[t["type"]][0]
            start = time.perf_counter()
            want = gr._repack_numpy(np.ascontiguousarray(raw), t["type"], shape, t["name"])
            per[name]["numpy_s"] += time.perf_counter() - start
            identical &= _same(gr.repack_gguf_tensor(raw, t["type"], shape, t["name"]), want)
            del want
    for t, _, _ in tensors:
        per[gr.GGML_TYPES[t["type"]][0]]["bytes"] += t["n_bytes"]
    for _ in range(args.repeat):
        run = dict.fromkeys(names, 0.0)
        for t, raw, shape in tensors:
            start = time.perf_counter()
            w = gr.repack_gguf_tensor(raw, t["type"], shape, t["name"])
            run[gr.GGML_TYPES[t["type"]][0]] += time.perf_counter() - start
            del w
        for n in names:
            per[n]["cpp_s"] = min(per[n]["cpp_s"], run[n])
    for _ in range(args.repeat):
        run = dict.fromkeys(names, 0.0)
        for t, raw, shape in tensors:
            outs = _outputs(t["type"], *shape)
            raw_t = gr._raw_tensor(np.ascontiguousarray(raw))
            start = time.perf_counter()
            cpu.gguf_repack(raw_t, t["type"], *outs)
            run[gr.GGML_TYPES[t["type"]][0]] += time.perf_counter() - start
            del outs
        for n in names:
            per[n]["cpp_warm_s"] = min(per[n]["cpp_warm_s"], run[n])

    def mbs(nbytes, s):
        return nbytes / s / 1e6 if s > 0 else float("nan")

    rows = []
    for n in names + ["whole file"]:
        p = per[n] if n in per else {k: sum(per[x][k] for x in names)
                                       for k in ("bytes", "numpy_s", "cpp_s", "cpp_warm_s")}
        rows.append({"type": n, "MB": p["bytes"] / 1e6,
                     "numpy_s": None if args.no_numpy else p["numpy_s"],
                     "numpy_MBps": None if args.no_numpy else mbs(p["bytes"], p["numpy_s"]),
                     "cpp_s": p["cpp_s"], "cpp_MBps": mbs(p["bytes"], p["cpp_s"]),
                     "cpp_warm_s": p["cpp_warm_s"],
                     "cpp_warm_MBps": mbs(p["bytes"], p["cpp_warm_s"])})
    head = f"{'type':<11}{'MB':>8}{'numpy s':>10}{'numpy MB/s':>12}{'C++ s':>8}" \
           f"{'C++ MB/s':>10}{'warm s':>8}{'warm MB/s':>11}{'speedup':>9}"
    print(head)
    for r in rows:
        np_s = "-" if r["numpy_s"] is None else f"{r['numpy_s']:.3f}"
        np_r = "-" if r["numpy_MBps"] is None else f"{r['numpy_MBps']:.0f}"
        speed = "-" if r["numpy_s"] is None else f"{r['numpy_s'] / r['cpp_s']:.1f}x"
        print(f"{r['type']:<11}{r['MB']:>8.1f}{np_s:>10}{np_r:>12}{r['cpp_s']:>8.3f}"
              f"{r['cpp_MBps']:>10.0f}{r['cpp_warm_s']:>8.3f}{r['cpp_warm_MBps']:>11.0f}"
              f"{speed:>9}")
    if identical is not None:
        print(f"identical to numpy: {identical}")
    result = {"gguf": str(path), "threads": args.threads, "isa": cpu.isa_name(),
              "identical": identical, "rows": rows}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if identical in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
