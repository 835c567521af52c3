"""Stage 2 of ``gpu_check.sh``: the decode kernels at Llama-3.1-8B shapes, timed inside a CUDA graph.

Linears (x ``[M, K]`` bf16, M in ``--rows``): qkv 4096 -> 6144, o 4096 -> 4096, gate_up 4096 ->
28672, down 14336 -> 4096, LM head 4096 -> 128256, each as ``F.linear`` on the bf16 weight (the
baseline), the engine's fp8 linear (``torch._scaled_mm``, row-wise scales; sm_89+ only), and the
dispatched ``localchat.kernels.int8_matmul`` (per channel, G = K) and ``int4_matmul`` (G = 128,
``w = q * scale + min``). Decode attention: ``kernels.paged_attention_decode`` at a 4096-token
context, 32 query / 8 KV heads, head_dim 128, batch 1 and 16, beside SDPA on the same K/V
gathered contiguous (the baseline).

Method (the issue's): each op's weight (or KV) buffers are copied enough times that one pass
over the copies reads more than twice the L2 (``L2_cache_size``; 60 MB on an H200), so every
call reads a cold copy. Before any timing each implementation's output on copy 0 is checked
against its reference (fp32 maths: ``kernels.reference`` for the int kernels and attention,
the e4m3-rounded activations times the dequantized fp8 weight for ``_scaled_mm``, the fp32 weight for ``F.linear``): max error
within 2% of the reference's largest magnitude, else the row says ``mismatch`` and is not
timed. Then N calls (cycling over the copies) are captured into one CUDA graph, replayed once to
warm up, and three replays are timed with CUDA events; the median / N is the time per call.
GB/s = bytes one call must read (weights + scales, or the KV) / time, shown as % of the
device-to-device copy bandwidth timed the same way in the same run.

On CPU (``--tiny``, the dry run) the shapes are divided by 32, nothing is captured (the loop
runs eagerly, ``graph: no``) and the figures mean nothing: it checks the script.

Usage: ``python scripts/gpu_kernels_graph.py --device cuda --out DIR`` (writes
``kgraph.json`` and ``kgraph.md``, rewritten after every row).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from localchat import kernels
from localchat.kernels import reference

BLOCK = 16


def shapes(tiny: bool):
    d = 32 if tiny else 1
    lin = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672),
           ("down", 14336, 4096), ("lm_head", 4096, 128256)]
    return ([(n, k // d, -(-o // d // 16) * 16) for n, k, o in lin],  # tiny: N % 16 == 0
            {"heads": 32 // (4 if tiny else 1), "kv_heads": 8 // (4 if tiny else 1),
             "head_dim": 128 // (4 if tiny else 1), "context": 4096 // d})


def num_copies(nbytes: int, l2: int) -> int:
    """Copies of an ``nbytes`` buffer so that one pass reads more than 2 x L2 (at least 2)."""
    return max(2, -(-2 * l2 // max(nbytes, 1)) + 1)


def close(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |got - want| relative to want's largest magnitude."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-6)
            ).item()


def time_rotated(fns, device: torch.device, calls: int) -> tuple[float, bool]:
    """Seconds per call of ``fns[i % len(fns)]()`` over ``calls`` calls: inside one CUDA graph
    on a GPU (median of 3 replays, CUDA events), eagerly on CPU. Returns ``(seconds, graphed)``."""
    calls = max(calls, len(fns))
    calls -= calls % len(fns)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        return (time.perf_counter() - t0) / calls, False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (Triton compiles, cuBLAS plans)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del graph
    return statistics.median(times) / calls, True


def linear_impls(x, n, k, copies_for, gen, device, fp8: bool):
    """``[(impl, [fn per copy], bytes per call, check fn -> rel error)]`` for one linear."""
    from localchat.engine.quant.fp8 import dequantize_fp8, fp8_linear, quantize_fp8

    out = []
    w32 = torch.randn(n, k, generator=gen, device=device) * 0.02
    wb = w32.to(torch.bfloat16)
    nb = n * k * 2
    ws = [wb] + [wb.clone() for _ in range(copies_for(nb) - 1)]
    out.append(("F.linear bf16", [lambda w=w: F.linear(x, w) for w in ws], nb,
                lambda: close(F.linear(x, ws[0]), F.linear(x.float(), wb.float()))))
    if fp8:
        qf, sf = quantize_fp8(w32)
        nb = n * k + 4 * n
        cps = [(qf, sf)] + [(qf.clone(), sf.clone()) for _ in range(copies_for(nb) - 1)]
        # reference: the same per-row e4m3 activation rounding fp8_linear applies, then fp32
        # maths on the dequantized weight (only the bf16 output rounding is left to differ)
        xs = (x.float().abs().amax(dim=-1, keepdim=True) / 448.0).clamp(min=1e-12)
        xq = (x.float() / xs).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * xs
        if n % 16 or k % 16:  # fp8_linear's fallback: bf16 activations, dequantized weight
            xq = x.float()
        out.append(("fp8 _scaled_mm", [lambda c=c: fp8_linear(x, *c) for c in cps], nb,
                    lambda: close(fp8_linear(x, qf, sf),
                                  F.linear(xq, dequantize_fp8(qf, sf)))))
    del w32
    q8 = torch.randint(-127, 128, (n, k), generator=gen, device=device, dtype=torch.int8)
    s8 = torch.rand(n, 1, generator=gen, device=device) * 1e-3
    nb = n * k + 4 * n
    cps = [(q8, s8)] + [(q8.clone(), s8.clone()) for _ in range(copies_for(nb) - 1)]
    out.append(("int8_matmul (per channel)",
                [lambda c=c: kernels.int8_matmul(x, c[0], c[1]) for c in cps], nb,
                lambda: close(kernels.int8_matmul(x, q8, s8),
                              reference.int8_matmul(x.float(), q8, s8))))
    g = 128 if k % 128 == 0 else 32  # 8B shapes: 128 (the --tiny down proj: 32)
    q4 = torch.randint(0, 256, (n, k // 2), generator=gen, device=device, dtype=torch.uint8)
    s4 = torch.rand(n, k // g, generator=gen, device=device) * 1e-3
    m4 = -7.5 * s4
    nb = n * k // 2 + 8 * n * (k // g)
    cps = [(q4, s4, m4)] + [tuple(t.clone() for t in (q4, s4, m4))
                            for _ in range(copies_for(nb) - 1)]
    out.append((f"int4_matmul (g{g})",
                [lambda c=c: kernels.int4_matmul(x, *c, g) for c in cps], nb,
                lambda: close(kernels.int4_matmul(x, q4, s4, m4, g),
                              reference.int4_matmul(x.float(), q4, s4, m4, g))))
    return out


def attention_impls(bs, a, copies_for, gen, device):
    """The paged decode kernel and SDPA on contiguous K/V at ``bs`` x ``a['context']``."""
    h, kvh, d, ctx = a["heads"], a["kv_heads"], a["head_dim"], a["context"]
    nb_seq = ctx // BLOCK
    kv_bytes = 2 * bs * ctx * kvh * d * 2
    q = torch.randn(bs, h, d, generator=gen, device=device).to(torch.bfloat16)
    sl = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    copies = []
    for _ in range(copies_for(kv_bytes)):
        kc = torch.randn(bs * nb_seq + 1, BLOCK, kvh, d, generator=gen, device=device
                         ).to(torch.bfloat16)
        vc = torch.randn_like(kc)
        bt = (torch.randperm(bs * nb_seq, generator=gen, device=device) + 1).view(bs, nb_seq)
        copies.append((kc, vc, bt))
    scale = d ** -0.5

    def paged(c):
        return kernels.paged_attention_decode(q, c[0], c[1], c[2], sl, scale, max_seq_len=ctx)

    contig = [tuple(t[c[2]].reshape(bs, ctx, kvh, d).transpose(1, 2).contiguous()
                    for t in c[:2]) for c in copies]

    def sdpa(kv):
        return F.scaled_dot_product_attention(q[:, :, None], kv[0], kv[1], scale=scale,
                                              enable_gqa=True)[:, :, 0]

    ref = lambda: reference.paged_attention_decode(q.float(), copies[0][0].float(),
                                                   copies[0][1].float(), copies[0][2], sl,
                                                   scale)
    return [("paged_attention_decode", [lambda c=c: paged(c) for c in copies], kv_bytes,
             lambda: close(paged(copies[0]), ref())),
            ("SDPA contiguous KV", [lambda c=c: sdpa(c) for c in contig], kv_bytes,
             lambda: close(sdpa(contig[0]), ref()))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="shapes / 32 (script check on CPU)")
    ap.add_argument("--rows", default="1,16", help="M of the linears")
    ap.add_argument("--calls", type=int, default=64, help="calls captured per graph")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels_graph: error: CUDA is not available", file=sys.stderr)
        return 2
    from localchat.engine.quant.schemes import fp8_supported

    # CPU: torch's CPU _scaled_mm runs the fp8 rows too (the script check covers them)
    fp8 = fp8_supported(device) if device.type == "cuda" else hasattr(torch, "_scaled_mm")
    l2 = (torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda"
          else 2**20)
    copies_for = lambda nbytes: num_copies(nbytes, l2)
    gen = torch.Generator(device=device).manual_seed(0)
    lin, attn = shapes(args.tiny)
    rows: list[dict] = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    n_copy = (2**30 if device.type == "cuda" else 2**24) // 4
    src = torch.randn(n_copy, device=device)
    dst = torch.empty_like(src)
    sec, graphed = time_rotated([lambda: dst.copy_(src)], device, 8)
    peak = 2 * n_copy * 4 / sec
    src = dst = None
    print(f"device {name}, L2 {l2 / 2**20:.0f} MiB, copy {peak / 1e9:.0f} GB/s "
          f"(read + write, graph: {graphed})", flush=True)

    def write() -> None:
        md = ["| op | shape | impl | copies | max rel err | us/call | GB/s | % of copy |",
              "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            t = "mismatch" if r["us"] is None else f"{r['us']:.1f}"
            md += [f"| {r['op']} | {r['shape']} | {r['impl']} | {r['copies']} | "
                   f"{r['rel_err']:.1e} | {t} | "
                   + (f"{r['GBps']:.0f} | {r['pct_of_copy']:.0f} |" if r["us"] else "- | - |")]
        md += ["", (f"Inside a CUDA graph: {graphed}; copy bandwidth {peak / 1e9:.0f} GB/s; "
                    f"L2 {l2 / 2**20:.0f} MiB; fp8 rows: {fp8}.")]
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "kgraph.json").write_text(json.dumps(
                {"device": name, "l2_bytes": l2, "copy_GBps": peak / 1e9, "graphs": graphed,
                 "rows": rows}, indent=1))
            (args.out / "kgraph.md").write_text("\n".join(md) + "\n")

    def run(op, shape, impls):
        for impl, fns, nbytes, check in impls:
            err = check()
            ok = err <= 2e-2
            us = gbps = None
            if ok:
                sec, _ = time_rotated(fns, device, args.calls)
                us, gbps = sec * 1e6, nbytes / sec / 1e9
            rows.append({"op": op, "shape": shape, "impl": impl, "copies": len(fns),
                         "bytes": nbytes, "rel_err": err, "us": us, "GBps": gbps,
                         "pct_of_copy": None if gbps is None else 100 * gbps * 1e9 / peak})
            print(f"  {op:8s} {shape:22s} {impl:26s} x{len(fns):<3d} err {err:.1e} "
                  + (f"{us:9.1f} us {gbps:7.0f} GB/s {100 * gbps * 1e9 / peak:5.1f}%"
                     if ok else "MISMATCH (not timed)"), flush=True)
            write()

    with torch.inference_mode():
        for m in (int(r) for r in args.rows.split(",")):
            for op, k, n in lin:
                x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
                run(op, f"{m} x {k} -> {n}", linear_impls(x, n, k, copies_for, gen, device,
                                                           fp8))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        for bs in (1, 16):
            run("decode attention", f"{bs} x {attn['context']} tokens, "
                f"{attn['heads']}/{attn['kv_heads']} heads",
                attention_impls(bs, attn, copies_for, gen, device))
    write()
    bad = [r for r in rows if r["us"] is None]
    print(f"gpu_kernels_graph: {len(rows) - len(bad)} rows timed, {len(bad)} mismatched")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
