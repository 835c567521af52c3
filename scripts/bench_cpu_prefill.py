"""CPU prefill of int8 group-wise (GGUF Q5_x / Q6_K / Q8_0) layers: the row-block path
(``engine/quant/cpu_prefill.py``: C++ ``int8_dequantize`` into one shared scratch, bf16 GEMM
for bf16 activations) against ``torch.mm`` on the bf16 weight and against the path it replaced
(PyTorch ops dequantizing 256-row fp32 blocks into a per-layer buffer, fp32 GEMM; kept here as
``_old_blockwise``, the baseline).

1. Layers: Qwen2.5-Coder-0.5B's MLP shapes (``N x K`` = 4864 x 896 and 896 x 4864) and its
   fused qkv (1152 x 896), M = 512 activation rows, Q5_0-like weights (G = 32, fp16 scales):
   ``old fp32 blocks``, ``new bf16`` / ``new fp32`` (``cpu_prefill.int8_prefill`` on bf16 /
   fp32 activations) and ``torch.mm bf16`` / ``fp32`` on a float weight; per-channel int8
   (``--quant int8``): ``_weight_int8pack_mm`` (its kernel up to 16 rows, before for all)
   against the same row blocks (``new per-ch bf16``).
2. Model (unless ``--no-model``): prefill of ``--prompt-tokens`` (512) ids on
   Qwen2.5-Coder-0.5B's GGUF (133 Q5_0 tensors) with ``--quant native``, its int8 layers on
   the new path and, patched in, on the old one, against ``--quant none`` (bf16 on a CPU with
   native bf16), time to the first token (``engine.generate``, max_tokens 1, prefix cache
   reset). Its int4 layers (the 12 Q4_K ``down_proj``) prefill through
   ``cpu_int4.blockwise_int4`` (the same shared block loop); a fourth row loads ``native``
   with ``LOCALCHAT_CPU_INT4=int4pack``, which sends them to PyTorch's int4pack kernel.

Each figure is measured twice in one run, methods interleaved in rounds (best kept): with
``--threads`` threads as wall time (``perf_counter``), and on ONE thread as the calling
thread's CPU time (``time.thread_time``, which other processes' load on a shared machine
does not inflate; with one torch thread all the work runs on the calling thread). Read the
ratios (to ``torch.mm bf16`` for layers, to ``none`` for the model).

Usage: ``python scripts/bench_cpu_prefill.py [--threads 2] [--rounds 3] [--no-model]``
(also ``python scripts/bench_kernels.py --cpu-prefill``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

SHAPES = [(4864, 896), (896, 4864), (1152, 896)]  # (N, K)
MODEL = "qwen2.5-coder-0.5b"


def _old_blockwise(x, qweight, scales, mins, group_size, buf_holder, rows=256):
    """The int8-group prefill before ``cpu_prefill.py`` (copied from
    ``Int8GroupLinearMethod._blockwise``): fp32 activations, PyTorch ops dequantize 256-row
    blocks into a per-layer fp32 buffer, one fp32 GEMM per block into a strided output."""
    x = x.float()
    n, k = qweight.shape
    g = group_size
    buf = buf_holder.get(k)
    if buf is None:
        buf = buf_holder[k] = torch.empty(rows, k)
    out = torch.empty(x.shape[0], n)
    for a in range(0, n, rows):
        b = min(rows, n - a)
        w = buf[:b]
        w.copy_(qweight[a:a + b])
        wg = w.view(b, k // g, g)
        wg.mul_(scales[a:a + b, :, None])
        if mins is not None:
            wg.add_(mins[a:a + b, :, None])
        torch.mm(x, w.t(), out=out[:, a:a + b])
    return out


def _timed(fn, reps: int, clock) -> float:
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps


def _rounds(methods: dict, rounds: int, reps: int, threads: int, clock) -> dict:
    torch.set_num_threads(threads)
    for fn in methods.values():
        fn()
    best = {name: float("inf") for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            gc.collect()
            best[name] = min(best[name], _timed(fn, reps, clock))
    return best


def _layer_methods(n: int, k: int, m_rows: int) -> dict:
    from localchat.engine.quant.cpu_prefill import int8_prefill
    from localchat.kernels import reference

    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-16, 16, (n, k), generator=gen, dtype=torch.int8)
    s = (torch.rand(n, k // 32, generator=gen) * 0.01).half()
    wf = reference.dequantize_int8(q, s, None, 32)
    wb = wf.bfloat16()
    x = torch.randn(m_rows, k, generator=gen)
    xb = x.bfloat16()
    holder: dict = {}
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    s8 = (torch.rand(n, generator=gen) * 0.01).bfloat16()
    return {
        "int8pack per-ch": lambda: torch.ops.aten._weight_int8pack_mm(xb, q8, s8),
        "new per-ch bf16": lambda: int8_prefill(xb, q8, s8.float(), None, k),
        "old fp32 blocks": lambda: _old_blockwise(xb, q, s, None, 32, holder),
        "new bf16": lambda: int8_prefill(xb, q, s, None, 32),
        "new fp32": lambda: int8_prefill(x, q, s, None, 32),
        "torch.mm bf16": lambda: torch.mm(xb, wb.t()),
        "torch.mm fp32": lambda: torch.mm(x, wf.t()),
    }


def bench_layers(threads: int, rounds: int, m_rows: int = 512) -> None:
    for n, k in SHAPES:
        methods = _layer_methods(n, k, m_rows)
        wall = _rounds(methods, rounds, 3, threads, time.perf_counter)
        one = _rounds(methods, rounds, 2, 1, time.thread_time)
        print(f"  {n}x{k} M={m_rows}:", flush=True)
        for name in methods:
            print(f"    {name:16s} {threads} thr {wall[name] * 1e3:8.2f} ms "
                  f"({wall[name] / wall['torch.mm bf16']:5.2f}x bf16 mm)   1 thr CPU "
                  f"{one[name] * 1e3:8.2f} ms ({one[name] / one['torch.mm bf16']:5.2f}x)",
                  flush=True)


def bench_model(threads: int, rounds: int, prompt_tokens: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_decode as bd

    from localchat.app.settings import cache_dir
    from localchat.engine.config import EngineConfig, QuantConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.quant import cpu_int4, native
    from localchat.engine.sampling_params import SamplingParams
    from localchat.engine.tokenizer import Tokenizer

    cache = cache_dir()
    files = sorted((cache / "models" / MODEL).glob("*.gguf"))
    if not files:
        print(f"  model part skipped: no {MODEL} GGUF in {cache / 'models'}", flush=True)
        return
    path = files[0]
    ids = bd.prompt_ids(Tokenizer.from_pretrained(path, cache_dir=cache), prompt_tokens)
    def int4_mode(pack: bool) -> None:  # read once per process: cleared on each switch
        if pack:
            os.environ[cpu_int4.INT4_ENV] = "int4pack"
        else:
            os.environ.pop(cpu_int4.INT4_ENV, None)
        cpu_int4.own_kernels.cache_clear()

    saved = os.environ.get(cpu_int4.INT4_ENV)
    engines = {}
    for name, q, pack in (("none", "none", False), ("native", "native", False),
                          ("native int4pack", "native", True)):
        int4_mode(pack)
        engines[name] = LLMEngine.from_path(path, EngineConfig(device="cpu", quant=QuantConfig(
            scheme=q)), cache_dir=cache)
    int8_layers = sum(isinstance(mod.quant_method, native.Int8GroupLinearMethod)
                      for mod in engines["native"].runner.model.modules()
                      if hasattr(mod, "quant_method"))
    new_apply = native.Int8GroupLinearMethod.apply
    holders: dict = {}

    def old_apply(self, layer, x):
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] <= 16:
            return new_apply(self, layer, x)
        y = _old_blockwise(x2, layer.qweight, layer.scales, self._mins(layer),
                           self.group_size, holders.setdefault(id(layer), {})).to(x.dtype)
        y = y if layer.bias is None else y.add_(layer.bias)
        return y.reshape(*x.shape[:-1], -1)

    def prefill(q: str, patch=None):
        def run():
            native.Int8GroupLinearMethod.apply = patch or new_apply
            int4_mode(q.endswith("int4pack"))
            try:
                e = engines[q]
                e.reset_prefix_cache()
                list(e.generate(ids, SamplingParams(temperature=0.0, max_tokens=1,
                                                    ignore_eos=True)))
            finally:
                native.Int8GroupLinearMethod.apply = new_apply
        return run

    methods = {"none (bf16)": prefill("none"), "native new": prefill("native"),
               "native old": prefill("native", old_apply),
               "native new, int4pack": prefill("native int4pack")}
    dtype = next(p.dtype for p in engines["native"].runner.model.parameters()
                 if p.is_floating_point())
    print(f"  {MODEL} ({path.name}), {prompt_tokens}-token prompt, native int8-group "
          f"layers: {int8_layers}, activations {dtype}", flush=True)
    wall = _rounds(methods, rounds, 1, threads, time.perf_counter)
    one = _rounds(methods, max(1, rounds - 1), 1, 1, time.thread_time)
    if saved is None:
        os.environ.pop(cpu_int4.INT4_ENV, None)
    else:
        os.environ[cpu_int4.INT4_ENV] = saved
    cpu_int4.own_kernels.cache_clear()
    for name in methods:
        print(f"    {name:22s} {threads} thr {prompt_tokens / wall[name]:8.1f} tok/s "
              f"({wall['none (bf16)'] / wall[name]:5.2f}x none)   1 thr CPU "
              f"{prompt_tokens / one[name]:8.1f} tok/s ({one['none (bf16)'] / one[name]:5.2f}x)",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--no-model", action="store_true", help="layers only")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.prompt_tokens < 17:
        print("bench_cpu_prefill: error: --threads and --rounds must be >= 1, "
              "--prompt-tokens > 16", file=sys.stderr)
        return 2
    from localchat.kernels import cpu

    if not cpu.available():
        print("bench_cpu_prefill: error: the CPU kernels are not built", file=sys.stderr)
        return 1
    print(f"cpu int8-group prefill: {args.threads} threads (and 1), torch {torch.__version__}, "
          f"best ISA {cpu.isa_name(cpu.best_isa())}, {args.rounds} interleaved rounds (best "
          "kept)", flush=True)
    bench_layers(args.threads, args.rounds)
    if not args.no_model:
        bench_model(args.threads, args.rounds, args.prompt_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
