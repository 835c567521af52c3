"""Benchmark the data-plane ops: the PyTorch references everywhere, the Triton kernels on CUDA.

Workload: Llama-3.1-8B shapes (hidden 4096, 32 query / 8 KV heads, head_dim 128, MLP 14336,
block_size 16). Each op is timed as the median of repeated calls after warm-up (CUDA events
around each call on a GPU, ``perf_counter`` on CPU) and reported with the bytes it must move or
the FLOPs it must do:

- copy (``torch.Tensor.copy_``): read + write; on a GPU its GB/s is the practical peak that the
  other figures are divided by (``% peak``).
- ``store_kv_cache``: K and V rows read and written.
- ``paged_attention_decode``: the whole KV of every sequence read once (+ q, out).
- ``prefill_attention``: causal FLOPs, 2 x 2 x q_len x (context + q_len / 2) x heads x head_dim.
- ``rms_norm`` (read + write), ``fused_add_rms_norm`` (2 reads + 2 writes), ``apply_rope``
  (q and k read + written).
- ``int8_matmul`` / ``int4_matmul`` at M = 1 (GEMV: the packed weight + scales/zeros read
  once) and M = 512 (TFLOP/s), against ``F.linear`` on the bf16 weight and, on a GPU with
  fp8 (sm_89+), the engine's fp8 linear (``torch._scaled_mm``, row-wise scales).
- Baseline beside ``paged_attention_decode``: ``F.scaled_dot_product_attention`` over the same
  K/V gathered into contiguous tensors (checked against the reference like the kernels).

These timings are eager and reuse one weight buffer (a 4096 x 4096 int4 weight is 8 MB and
stays in an H200's 60 MB L2 between calls, so the int4/int8 GEMV rows read partly from L2):
``scripts/gpu_kernels_graph.py`` times the decode linears and attention at every real 8B shape
inside a CUDA graph with the buffers rotated past the L2 (stage 2b of ``gpu_check.sh``).

On CPU, when the C++ kernels build, each of ``store_kv_cache``, ``paged_attention_decode``,
``rms_norm``, ``fused_add_rms_norm``, ``apply_rope`` and ``silu_and_mul`` is timed as ``c++``
(``localchat.kernels.cpu``) next to its reference in the same run (the reference's output is
the check).

``--cpu-prefill`` runs ``scripts/bench_cpu_prefill.py``: the CPU int8-group prefill GEMMs
(``engine/quant/cpu_prefill.py``) at M = 512 against ``torch.mm`` on bf16 weights and the path
they replaced, then Qwen2.5-Coder-0.5B's 512-token prefill with ``--quant native`` against
``none`` (``--quick``: layers only). ``--cpu-quant`` runs ``scripts/bench_cpu_quant.py`` instead: the C++ CPU int4/int8 kernels
against PyTorch's CPU kernels and ``F.linear`` at M = 1, 5, 16. ``--cpu-model`` runs
``scripts/bench_cpu_model.py``: SmolLM2-135M decode tok/s with the C++ attention / norm / rope /
SiLU kernels against the same engine on the references, rounds interleaved.

Usage: ``python scripts/bench_kernels.py [--device cuda] [--dtype bfloat16] [--quick]
[--out DIR] [--cpu-quant] [--cpu-prefill] [--cpu-model]`` (``--out`` writes ``kernels.json`` and ``kernels.md`` there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from localchat.kernels import reference

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, BLOCK = 4096, 32, 8, 128, 14336, 16


def timeit(fn: Callable[[], object], device: torch.device, min_time: float) -> float:
    """Median seconds per call of ``fn`` (2 warm-up calls; at least 5 timed, up to
    ``min_time`` seconds)."""
    for _ in range(2):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < min_time and len(times) < 200):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paged(num_seqs: int, seq_len: int, dtype, device, gen):
    """Caches of ``num_seqs`` sequences of ``seq_len`` tokens in shuffled blocks."""
    nb = -(-seq_len // BLOCK)
    num_blocks = num_seqs * nb + 1
    kc = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
    vc = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
    bt = torch.randperm(num_seqs * nb, generator=gen).view(num_seqs, nb).to(device)
    return kc, vc, bt


def cases(device, dtype, quick: bool):
    """Yield ``(op, shape text, {impl: fn}, bytes moved or None, flops or None)``."""
    gen = torch.Generator().manual_seed(0)
    el = torch.tensor([], dtype=dtype).element_size()
    if device.type == "cuda":
        from localchat.kernels import (
            triton_decode,
            triton_kv,
            triton_norm,
            triton_prefill,
            triton_quant,
            triton_rope,
        )
        tri = {"store_kv_cache": triton_kv, "paged_attention_decode": triton_decode,
               "prefill_attention": triton_prefill, "rms_norm": triton_norm,
               "fused_add_rms_norm": triton_norm, "apply_rope": triton_rope,
               "int8_matmul": triton_quant, "int4_matmul": triton_quant}
        label = "triton"
    else:
        tri, label = {}, "c++"
        from localchat.kernels import cpu

        if cpu.available():  # the C++ CPU kernels (the matmuls: --cpu-quant)
            tri = {name: cpu for name in ("store_kv_cache", "paged_attention_decode",
                                          "rms_norm", "fused_add_rms_norm", "apply_rope",
                                          "silu_and_mul")}

    def both(name, call):
        out = {"reference": lambda: call(reference)}  # call(module) runs module.<name>(...)
        if name in tri:
            out[label] = lambda: call(tri[name])
        return out

    n = (64 if quick else 256) * 2**20 // 4 if device.type == "cpu" else 2**30 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    yield "copy", f"{n * 4 / 2**20:.0f} MiB fp32", {"torch": lambda: dst.copy_(src)}, \
        2 * n * 4, None

    tokens = 16
    kc, vc, _ = paged(4, 1024, dtype, device, gen)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
    slots = torch.randperm(kc.shape[0] * BLOCK, generator=gen)[:tokens].to(device)
    yield "store_kv_cache", f"{tokens} tokens", \
        both("store_kv_cache", lambda m: m.store_kv_cache(k, k, kc, vc, slots)), \
        4 * tokens * KV_HEADS * HEAD_DIM * el, None

    for num_seqs, seq_len in ([(1, 4096), (16, 1024)] if quick else
                              [(1, 512), (1, 4096), (1, 32768), (16, 1024), (16, 4096)]):
        kc, vc, bt = paged(num_seqs, seq_len, dtype, device, gen)
        q = torch.randn(num_seqs, HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
        sl = torch.full((num_seqs,), seq_len, device=device)
        kv_bytes = 2 * num_seqs * seq_len * KV_HEADS * HEAD_DIM * el
        # baseline: SDPA over the same K/V gathered into contiguous [seqs, kv heads, len, d]
        kg, vg = (c[bt].reshape(num_seqs, -1, KV_HEADS, HEAD_DIM)[:, :seq_len]
                  .transpose(1, 2).contiguous() for c in (kc, vc))
        impls = both("paged_attention_decode", lambda m, q=q, kc=kc, vc=vc, bt=bt, sl=sl:
                     m.paged_attention_decode(q, kc, vc, bt, sl, HEAD_DIM ** -0.5))
        if label == "c++" and tri and dtype == torch.bfloat16:  # vdpbf16ps scores vs FMAs
            impls["c++ fp32-FMA scores"] = lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl: \
                tri["paged_attention_decode"].paged_attention_decode(
                    q, kc, vc, bt, sl, HEAD_DIM ** -0.5, bf16_dot=False)
        impls["sdpa contiguous KV"] = lambda q=q, kg=kg, vg=vg: F.scaled_dot_product_attention(
            q[:, :, None], kg, vg, enable_gqa=True)[:, :, 0]
        yield "paged_attention_decode", f"{num_seqs} x {seq_len} tokens", impls, \
            kv_bytes + 2 * q.numel() * el, None

    for ctx, q_len in ([(0, 512)] if quick or device.type == "cpu" else
                       [(0, 2048), (1984, 64), (2043, 5)]):
        total = ctx + q_len
        kc, vc, bt = paged(1, total, dtype, device, gen)
        q = torch.randn(q_len, HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)
        qsl = torch.tensor([0, q_len], device=device)
        sl = torch.tensor([total], device=device)
        flops = 4 * q_len * (ctx + q_len / 2) * HEADS * HEAD_DIM
        yield "prefill_attention", f"{q_len} new over {ctx} cached", \
            both("prefill_attention", lambda m, q=q, kc=kc, vc=vc, bt=bt, qsl=qsl, sl=sl:
                 m.prefill_attention(q, kc, vc, qsl, sl, bt, HEAD_DIM ** -0.5)), None, flops

    w = torch.ones(HIDDEN, dtype=dtype, device=device)
    for rows in (1, 512):
        x = torch.randn(rows, HIDDEN, generator=gen).to(dtype).to(device)
        r = torch.randn(rows, HIDDEN, generator=gen).to(dtype).to(device)
        yield "rms_norm", f"{rows} x {HIDDEN}", \
            both("rms_norm", lambda m, x=x: m.rms_norm(x, w, 1e-5)), 2 * x.numel() * el, None
        yield "fused_add_rms_norm", f"{rows} x {HIDDEN}", \
            both("fused_add_rms_norm", lambda m, x=x, r=r: m.fused_add_rms_norm(x, r, w, 1e-5)), \
            4 * x.numel() * el, None
        qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
        qkv = qkv.to(device)
        qv = qkv[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
        kv = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, KV_HEADS,
                                                                          HEAD_DIM)
        pos = torch.randint(0, 8192, (rows,), generator=gen).to(device)
        cache = torch.randn(8192, HEAD_DIM, generator=gen).to(device)
        yield "apply_rope", f"{rows} tokens", \
            both("apply_rope", lambda m, qv=qv, kv=kv, pos=pos, c=cache: m.apply_rope(
                pos, qv, kv, c)), 2 * (qv.numel() + kv.numel()) * el, None
        gu = torch.randn(rows, 2 * INTER, generator=gen).to(dtype).to(device)
        yield "silu_and_mul", f"{rows} x 2 x {INTER}", \
            both("silu_and_mul", lambda m, gu=gu: m.silu_and_mul(gu)), 3 * rows * INTER * el, \
            None

    n_out, k_in, group = HIDDEN, HIDDEN, 128
    w16 = (torch.randn(n_out, k_in, generator=gen) * 0.02).to(dtype).to(device)
    q8 = torch.randint(-127, 128, (n_out, k_in), generator=gen, dtype=torch.int8).to(device)
    s8 = torch.rand(n_out, generator=gen).to(device) * 1e-3
    q4 = torch.randint(0, 256, (n_out, k_in // 2), generator=gen, dtype=torch.uint8).to(device)
    s4 = (torch.rand(n_out, k_in // group, generator=gen) * 1e-3).to(device)
    m4 = -8.0 * s4  # mins: w = q * scale + min
    s8g = (torch.rand(n_out, k_in // 32, generator=gen) * 1e-3).to(device)  # Q8_0-like G=32
    from localchat.engine.quant.fp8 import fp8_linear, quantize_fp8
    from localchat.engine.quant.schemes import fp8_supported

    fp8 = fp8_supported(device)
    qf8, sf8 = quantize_fp8(w16.float()) if fp8 else (None, None)
    for m_rows in ((1,) if device.type == "cpu" and quick else (1, 512)):
        x = torch.randn(m_rows, k_in, generator=gen).to(dtype).to(device)
        gemv = m_rows == 1
        flops = None if gemv else 2 * m_rows * n_out * k_in
        act = 2 * m_rows * (k_in + n_out) * el
        yield "linear (float weight)", f"{m_rows} x {k_in} -> {n_out}", \
            {"torch": lambda x=x: F.linear(x, w16)}, \
            (n_out * k_in * el + act) if gemv else None, flops
        if fp8:  # baseline: the engine's fp8 path, torch._scaled_mm with row-wise scales
            yield "linear (fp8 _scaled_mm)", f"{m_rows} x {k_in} -> {n_out}", \
                {"torch": lambda x=x: fp8_linear(x, qf8, sf8)}, \
                (n_out * k_in + 4 * n_out + act) if gemv else None, flops
        # GEMV rows also time the single-pass variant (split_k=1) against split-K
        def single(impls, name, call, gemv=gemv):
            if gemv and name in tri:
                impls["triton split_k=1"] = lambda: call(tri[name])
            return impls

        yield "int8_matmul", f"{m_rows} x {k_in} -> {n_out}", single(
            both("int8_matmul", lambda m, x=x: m.int8_matmul(x, q8, s8)), "int8_matmul",
            lambda m, x=x: m.int8_matmul(x, q8, s8, split_k=1)), \
            (n_out * k_in + 4 * n_out + act) if gemv else None, flops
        yield "int8_matmul", f"{m_rows} x {k_in} -> {n_out} g32", single(
            both("int8_matmul", lambda m, x=x: m.int8_matmul(x, q8, s8g)), "int8_matmul",
            lambda m, x=x: m.int8_matmul(x, q8, s8g, split_k=1)), \
            (n_out * k_in + 4 * n_out * (k_in // 32) + act) if gemv else None, flops
        yield "int4_matmul", f"{m_rows} x {k_in} -> {n_out} g{group}", single(
            both("int4_matmul", lambda m, x=x: m.int4_matmul(x, q4, s4, m4, group)),
            "int4_matmul", lambda m, x=x: m.int4_matmul(x, q4, s4, m4, group, split_k=1)), \
            (n_out * k_in // 2 + 8 * n_out * (k_in // group) + act) if gemv else None, flops


_IN_PLACE = ("store_kv_cache", "fused_add_rms_norm")  # their outputs alias their inputs


def _outputs(out) -> list[torch.Tensor]:
    if out is None:
        return []
    return [t.float() for t in (out if isinstance(out, (tuple, list)) else (out,))]


def _matches(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Every output within 2% of the reference's largest magnitude (bf16 roundings)."""
    return len(got) == len(want) and all(
        g.shape == w.shape and (g - w).abs().max().item()
        <= 2e-2 * max(w.abs().max().item(), 1e-6) for g, w in zip(got, want))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller shapes")
    ap.add_argument("--out", type=Path, default=None, help="write kernels.json/.md here")
    ap.add_argument("--cpu-quant", action="store_true",
                    help="only the CPU quantized matmuls vs torch's (scripts/bench_cpu_quant.py)")
    ap.add_argument("--cpu-prefill", action="store_true",
                    help="only the CPU int8-group prefill GEMMs (and Qwen2.5-0.5B native vs "
                         "bf16 prefill) vs torch.mm bf16 (scripts/bench_cpu_prefill.py)")
    ap.add_argument("--cpu-model", action="store_true",
                    help="only SmolLM2 decode tok/s on CPU: the C++ kernels vs the references, "
                         "rounds interleaved (scripts/bench_cpu_model.py)")
    args = ap.parse_args(argv)
    if args.cpu_model:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_cpu_model

        return bench_cpu_model.main(["--quick"] if args.quick else [])
    if args.cpu_prefill:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_cpu_prefill

        return bench_cpu_prefill.main(["--no-model"] if args.quick else [])
    if args.cpu_quant:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_cpu_quant

        return bench_cpu_quant.main(["--quick"] if args.quick else [])
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    min_time = 0.3 if device.type == "cuda" else 0.5
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"workload: Llama-3.1-8B shapes, {dtype}, device {name}, torch {torch.__version__},"
          f" {torch.get_num_threads()} threads", flush=True)
    rows, peak = [], None
    for op, shape, impls, nbytes, flops in cases(device, dtype, args.quick):
        want = _outputs(impls["reference"]()) if "reference" in impls \
            and op not in _IN_PLACE else None
        for impl, fn in impls.items():
            ok = None
            if want is not None and impl != "reference":  # checked before it is timed
                ok = _matches(_outputs(fn()), want)
            sec = timeit(fn, device, min_time)
            row = {"op": op, "shape": shape, "impl": impl, "us": sec * 1e6, "matches": ok,
                   "GB/s": nbytes / sec / 1e9 if nbytes else None,
                   "TFLOP/s": flops / sec / 1e12 if flops else None, "bytes": nbytes,
                   "flops": flops}
            if op == "copy":
                peak = row["GB/s"]
            row["% peak"] = 100 * row["GB/s"] / peak if nbytes and peak else None
            rows.append(row)
            print(f"  {op:24s} {shape:28s} {impl:9s} {sec * 1e6:10.1f} us"
                  + (f" {row['GB/s']:8.1f} GB/s ({row['% peak']:.0f}% of copy)" if nbytes
                     else "")
                  + (f" {row['TFLOP/s']:7.2f} TFLOP/s" if flops else "")
                  + ("" if ok is None else f" matches reference: {ok}"), flush=True)
    md = ["| op | shape | impl | us | GB/s | % of copy peak | TFLOP/s | matches reference |",
          "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f: "" if v is None else format(v, f)
    for r in rows:
        md.append(f"| {r['op']} | {r['shape']} | {r['impl']} | {r['us']:.1f} | "
                  f"{fmt(r['GB/s'], '.1f')} | {fmt(r['% peak'], '.0f')} | "
                  f"{fmt(r['TFLOP/s'], '.2f')} | {'' if r['matches'] is None else r['matches']} |")
    result = {"device": name, "dtype": str(dtype), "torch": torch.__version__,
              "copy_peak_GBps": peak, "rows": rows}
    print("\n".join(md))
    print(json.dumps(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernels.json").write_text(json.dumps(result, indent=1))
        (args.out / "kernels.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
