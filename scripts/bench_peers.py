"""Peer benchmark: localchat vs llama.cpp (``llama-cpp-python``) vs transformers, one GGUF.

Usage::

    pip install 'localchat[bench]'          # llama-cpp-python; builds llama.cpp from source
    python scripts/bench_peers.py --threads 2 --rounds 3
    python scripts/bench_peers.py --models smollm2-135m --quant int4 --json peers.json
    python scripts/bench_peers.py --llama-bench /path/to/llama.cpp/build/bin/llama-bench
    python scripts/bench_peers.py --llama-peer /path/to/llama_peer   # scripts/llama_peer.cpp

The llama.cpp peer is, in this order of preference: ``--llama-peer`` (``scripts/llama_peer.cpp``
built against a llama.cpp tree: a persistent process over ``llama.h`` fed the same prompt ids,
greedy), ``--llama-bench`` (llama.cpp's own ``llama-bench``: ``pp`` over random ids, then
``tg`` at depth ``--prompt-tokens``), else ``llama-cpp-python`` when it is installed and passes
a 4-token probe in a child process.

For each model (``smollm2-135m``; the Qwen bundles only when already in the localchat cache,
never downloaded), the three engines load the same GGUF file once, run with the same
``--threads``, and are then timed in ROUNDS INTERLEAVED (localchat, llama.cpp, transformers,
localchat, ...) so the machine's load falls on all of them alike; medians are reported:

* prefill tok/s: ``--prompt-tokens`` (512) ids / time to the first generated token (batch 1).
* decode tok/s: greedy, EOS ignored, ``--new-tokens`` (128); (n - 1) / time between the first
  and the last token.
* ratios: localchat's decode and prefill over llama.cpp's and over transformers'.
* forward 5 / step: localchat's model forward over 5 new tokens (what verifying 4 draft tokens
  costs: 5 rows of logits) over its forward over 1 token, both after the prompt (median of
  ``--rounds`` x 5 alternating pairs); llama.cpp's too with ``--llama-peer``.
* read bandwidth: ``torch.sum`` over a 512 MiB fp32 buffer, best of 3, same threads, measured
  in every round; localchat's decode GB/s (weight bytes x decode tok/s, an upper estimate as in
  ``bench_decode.py``) is printed as a percentage of it.

localchat runs with ``--quant`` (default ``int4``, the format that reads the fewest bytes here;
``auto`` / ``none`` / ``int8`` too); llama.cpp runs the file's own quantization; transformers
dequantizes the GGUF to fp32. Without ``llama-cpp-python`` the llama.cpp column is skipped with
a note. Figures on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_decode as bd


def read_bandwidth_gbs(mib: int = 512) -> float:
    """Best-of-3 GB/s of ``torch.sum`` over an ``mib`` MiB fp32 buffer (read only)."""
    buf = torch.ones(mib * 2**20 // 4)
    buf.sum()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


class Localchat:
    name = "localchat"

    def __init__(self, path: Path, quant: str, cache_dir: Path) -> None:
        from localchat.engine.config import EngineConfig, QuantConfig
        from localchat.engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_path(
            path, EngineConfig(device="cpu", quant=QuantConfig(scheme=quant)),
            cache_dir=cache_dir)
        self.weight_bytes = bd.param_bytes(self.engine.runner.model)
        for module in self.engine.runner.model.modules():  # quantized layers keep buffers
            self.weight_bytes += sum(b.numel() * b.element_size() for n, b in
                                     module.named_buffers(recurse=False)
                                     if n in ("qweight", "scales", "zeros", "mins",
                                              "qweight_cpu", "scales_and_zeros"))

    def _gen(self, prompt, n):
        from localchat.engine.sampling_params import SamplingParams

        self.engine.reset_prefix_cache()
        return list(self.engine.generate(prompt, SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True)))[-1]

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        m = self._gen(ids, n).metrics
        return (len(ids) / (m.first_token_time - m.arrival_time),
                (n - 1) / (m.last_token_time - m.first_token_time))


def llama_cpp_problem(path: Path, threads: int) -> str | None:
    """None if llama-cpp-python loads ``path`` and evaluates 4 tokens in a child process;
    else why not (not installed, or the child died, e.g. a build using instructions this
    CPU or kernel does not allow)."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'localchat[bench]')"
    code = ("import sys; from llama_cpp import Llama; "
            "Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=64, "
            "verbose=False).eval([1, 2, 3, 4])")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(threads)],
                          check=False, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:120]
        return f"llama-cpp-python failed a 4-token probe (exit {proc.returncode}) {tail}"
    return None


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path: Path, threads: int, ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                         n_ctx=ctx, n_batch=512, verbose=False)
        self.weight_bytes = path.stat().st_size

    def _gen(self, prompt, n):
        import numpy as np

        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        times = []
        for i in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            times.append(time.perf_counter())
            if i < n - 1:
                llm.eval([tok])
        return t0, times

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        t0, times = self._gen(ids, n)
        return len(ids) / (times[0] - t0), (n - 1) / (times[-1] - times[0])


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of the GGUF's tensor data (what llama.cpp reads per decode step, at most)."""
    from localchat.engine.loader.gguf import _tensor_index

    return sum(t["n_bytes"] for t in _tensor_index(path, None)["tensors"])


class LlamaPeer:
    """llama.cpp through ``scripts/llama_peer.cpp``'s ``serve`` mode: one child process holds
    the model; each measurement sends the prompt ids and reads back one JSON line."""

    name = "llama.cpp"

    def __init__(self, exe: Path, path: Path, threads: int) -> None:
        import subprocess

        self.proc = subprocess.Popen([str(exe), "serve", str(path), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.weight_bytes = gguf_tensor_bytes(path)
        self.forward5 = []

    def _run(self, ids, n) -> dict:
        self.proc.stdin.write(",".join(map(str, [n, *ids])) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"llama_peer exited with {self.proc.wait()}")
        return json.loads(line)

    def _gen(self, prompt, n):
        return self._run(prompt, n)

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        r = self._run(ids, n)
        self.forward5.append(r["forward5_s"] / r["step1_s"])
        return len(ids) / r["prefill_s"], (n - 1) / r["decode_s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class LlamaBench:
    """llama.cpp's ``llama-bench`` binary, run per measurement: ``-p P -n 0`` (prefill of P
    random ids) and ``-p 0 -n N -d P`` (N tokens after a P-token context), 1 repetition."""

    name = "llama.cpp"

    def __init__(self, exe: Path, path: Path, threads: int) -> None:
        self.cmd = [str(exe), "-m", str(path), "-t", str(threads), "-r", "1", "-o", "json"]
        self.weight_bytes = gguf_tensor_bytes(path)

    def _ts(self, *args) -> float:
        import subprocess

        out = subprocess.run(self.cmd + list(args), capture_output=True, text=True,
                             timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr[-300:]}")
        return float(json.loads(out.stdout)[0]["avg_ts"])

    def warm(self, ids):
        self._ts("-p", "32", "-n", "0")

    def measure(self, ids, n):
        return (self._ts("-p", str(len(ids)), "-n", "0"),
                self._ts("-p", "0", "-n", str(n), "-d", str(len(ids))))


def forward5_over_step(engine, ids: list[int], pairs: int) -> float:
    """Median over ``pairs`` of (model forward over 5 new tokens after ``ids`` with 5 rows of
    logits) / (forward over 1 new token with 1 row), alternating, on localchat's own model and
    KV cache (the engine is idle; its prefix cache is reset after)."""
    from localchat.engine.step_inputs import BatchEntry, build_batch

    runner = engine.runner
    model, bs = runner.model, runner.block_size
    blocks = list(range(-(-(len(ids) + 8) // bs)))

    def forward(start, tokens, rows):
        t0 = time.perf_counter()
        input_ids, positions, meta, groups = build_batch(
            [BatchEntry(blocks, start, tokens, rows)], bs, runner.device, runner.staging)
        hidden = model(input_ids, positions, runner.kv_caches, meta)
        model.compute_logits(hidden[groups[0]]).argmax(-1).tolist()
        return time.perf_counter() - t0

    ratios = []
    with torch.inference_mode():
        forward(0, ids, "last")  # the prompt's KV
        tail = ids[-5:]
        forward(len(ids), tail, "all"), forward(len(ids), tail[:1], "last")  # warm both shapes
        for _ in range(pairs):
            five = forward(len(ids), tail, "all")
            one = forward(len(ids), tail[:1], "last")
            ratios.append(five / one)
    engine.reset_prefix_cache()
    return statistics.median(ratios)


class Transformers:
    name = "transformers"

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        import functools

        import transformers.modeling_gguf_pytorch_utils as gguf_utils  # a bare tqdm bar

        gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        gen = self.model.generation_config
        pad = gen.eos_token_id if gen.pad_token_id is None else gen.pad_token_id
        self.pad = pad[0] if isinstance(pad, list) else pad
        self.weight_bytes = bd.param_bytes(self.model)

    def _gen(self, prompt, n):
        input_ids = torch.tensor([prompt])
        streamer = bd._TimingStreamer()
        with torch.inference_mode():
            t0 = time.perf_counter()
            self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                pad_token_id=self.pad, streamer=streamer)
        del streamer.times[0]
        return t0, streamer.times

    def warm(self, ids):
        bd.warm_up(self._gen, ids)

    def measure(self, ids, n):
        t0, times = self._gen(ids, n)
        return len(ids) / (times[0] - t0), (n - 1) / (times[-1] - times[0])


def bench_model(alias, path, args, cache) -> dict:
    from localchat.engine.tokenizer import Tokenizer

    ids = bd.prompt_ids(Tokenizer.from_pretrained(path, cache_dir=cache), args.prompt_tokens)
    engines = [Localchat(path, args.quant, cache)]
    if args.llama_peer is not None:
        engines.append(LlamaPeer(args.llama_peer, path, args.threads))
    elif args.llama_bench is not None:
        engines.append(LlamaBench(args.llama_bench, path, args.threads))
    elif (problem := llama_cpp_problem(path, args.threads)) is None:
        engines.append(LlamaCpp(path, args.threads, args.prompt_tokens + args.new_tokens + 64))
    else:
        print(f"  llama.cpp skipped: {problem}", flush=True)
    if not args.no_transformers:
        engines.append(Transformers(path))
    for e in engines:
        e.warm(ids)
    samples = {e.name: {"prefill": [], "decode": []} for e in engines}
    bandwidth = []
    for r in range(args.rounds):
        bandwidth.append(read_bandwidth_gbs())
        for e in engines:
            gc.collect()
            p, d = e.measure(ids, args.new_tokens)
            samples[e.name]["prefill"].append(p)
            samples[e.name]["decode"].append(d)
            print(f"  round {r + 1} {e.name:12s} prefill {p:8.1f} tok/s  decode {d:7.2f} tok/s",
                  flush=True)
    f5 = forward5_over_step(engines[0].engine, ids, 5 * args.rounds)
    for e in engines:
        if hasattr(e, "close"):
            e.close()
    bw = statistics.median(bandwidth)
    out = {"model": alias, "read_bandwidth_gbs": bw, "engines": {}}
    for e in engines:
        s = samples[e.name]
        dec, pre = statistics.median(s["decode"]), statistics.median(s["prefill"])
        out["engines"][e.name] = {"prefill_tok_s": pre, "decode_tok_s": dec,
                                  "weight_bytes": e.weight_bytes,
                                  "decode_gb_s": e.weight_bytes * dec / 1e9, "samples": s}
    ours = out["engines"]["localchat"]
    ours["decode_pct_of_read_bw"] = 100 * ours["decode_gb_s"] / bw
    ours["forward5_over_step"] = f5
    for e in engines:
        if getattr(e, "forward5", None):
            out["engines"][e.name]["forward5_over_step"] = statistics.median(e.forward5)
    for peer in ("llama.cpp", "transformers"):
        if peer in out["engines"]:
            ours[f"decode_ratio_vs_{peer}"] = ours["decode_tok_s"] / \
                out["engines"][peer]["decode_tok_s"]
            ours[f"prefill_ratio_vs_{peer}"] = ours["prefill_tok_s"] / \
                out["engines"][peer]["prefill_tok_s"]
    return out


def print_table(results: list[dict]) -> None:
    print("\n| model | engine | prefill tok/s | decode tok/s | decode GB/s | decode / llama.cpp |"
          " prefill / llama.cpp | decode / transformers | % of read BW | forward 5 / step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        for name, e in res["engines"].items():
            def ratio(key, e=e):
                return f"{e[key]:.2f}x" if key in e else ""
            pct = f"{e['decode_pct_of_read_bw']:.0f}% of {res['read_bandwidth_gbs']:.1f}" \
                if "decode_pct_of_read_bw" in e else ""
            print(f"| {res['model']} | {name} | {e['prefill_tok_s']:.1f} | "
                  f"{e['decode_tok_s']:.2f} | {e['decode_gb_s']:.2f} | "
                  f"{ratio('decode_ratio_vs_llama.cpp')} | {ratio('prefill_ratio_vs_llama.cpp')}"
                  f" | {ratio('decode_ratio_vs_transformers')} | {pct} |"
                  f" {ratio('forward5_over_step')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=bd.MODELS, choices=bd.MODELS)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--quant", default="int4", choices=["auto", "none", "int8", "int4"])
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers peer")
    ap.add_argument("--llama-peer", type=Path, metavar="EXE",
                    help="llama.cpp peer: a binary built from scripts/llama_peer.cpp")
    ap.add_argument("--llama-bench", type=Path, metavar="EXE",
                    help="llama.cpp peer: llama.cpp's llama-bench binary")
    ap.add_argument("--json", type=Path, help="also write the JSON result here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.new_tokens < 2 or args.prompt_tokens < 16 or args.threads < 1:
        print("bench_peers: error: need --rounds >= 1, --new-tokens >= 2, --prompt-tokens >= 16"
              " and --threads >= 1", file=sys.stderr)
        return 2
    for exe in (args.llama_peer, args.llama_bench):
        if exe is not None and not os.access(exe, os.X_OK):
            print(f"bench_peers: error: {exe} is not an executable file", file=sys.stderr)
            return 2

    from localchat.app.settings import cache_dir
    from localchat.engine.errors import ModelDownloadError, ModelNotFoundError
    from localchat.engine.hub.resolve import resolve_model

    torch.set_num_threads(args.threads)
    cache = cache_dir()
    print(f"workload: {args.threads} threads, batch 1, {args.prompt_tokens}-token prompt, "
          f"{args.new_tokens} greedy tokens, localchat --quant {args.quant}, "
          f"{args.rounds} interleaved rounds, cpu {bd.cpu_model()}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for alias in args.models:
        try:
            path = resolve_model(alias, cache_dir=cache,
                                 download=alias in bd.DOWNLOADABLE).path
        except (ModelNotFoundError, ModelDownloadError) as exc:
            print(f"  skipped {alias}: {exc}", flush=True)
            continue
        print(f"{alias}: {path}", flush=True)
        results.append(bench_model(alias, path, args, cache))
    print_table(results)
    text = json.dumps({"threads": args.threads, "quant": args.quant, "results": results},
                      indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
