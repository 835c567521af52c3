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
a 4-token probe in a child process (``llama_peers.py``).

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
  ``--rounds`` x 5 alternating pairs), on the kernels the engine decodes with (the integer-dot
  ones where an automatically fp32 CPU engine decodes through them); llama.cpp's too with
  ``--llama-peer``.
* read bandwidth: ``torch.sum`` over a 512 MiB fp32 buffer, best of 3, same threads, measured
  in every round; localchat's decode GB/s (weight bytes x decode tok/s, an upper estimate as in
  ``bench_decode.py``) is printed as a percentage of it. Both probes: ``peer_probes.py``.

localchat runs with ``--quant`` (default ``int4``, the format that reads the fewest bytes here;
``auto`` / ``native`` / ``none`` / ``int8`` too); llama.cpp runs the file's own quantization;
transformers dequantizes the GGUF to fp32. Without ``llama-cpp-python`` the llama.cpp column is skipped with
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
from llama_peers import pick_llama_peer
from peer_probes import forward5_over_step, read_bandwidth_gbs


def decode_read_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer (whatever a layout
    names them: ``qweight``, ``qlow``, ``super_scales``, ...; ``weight_t`` too), less the
    RoPE table and, where the output layer is its own (untied), the embedding table, of which
    a step reads one row."""
    skip = set()
    if getattr(model, "lm_head", None) is not None:
        skip = {id(t) for t in model.model.embed_tokens.state_dict(keep_vars=True).values()}
    tensors = [t for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if not n.endswith("cos_sin_cache") and id(t) not in skip]
    tensors += [m.weight_t for m in model.modules() if getattr(m, "weight_t", None) is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


class Localchat:
    name = "localchat"

    def __init__(self, path: Path, quant: str, cache_dir: Path) -> None:
        from localchat.engine.config import EngineConfig, QuantConfig
        from localchat.engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_path(
            path, EngineConfig(device="cpu", quant=QuantConfig(scheme=quant)),
            cache_dir=cache_dir)
        self.weight_bytes = decode_read_bytes(self.engine.runner.model)

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
    peer, problem = pick_llama_peer(path, args.threads,
                                    args.prompt_tokens + args.new_tokens + 64,
                                    peer_exe=args.llama_peer, bench_exe=args.llama_bench)
    if peer is not None:
        engines.append(peer)
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
    ap.add_argument("--quant", default="int4", choices=["auto", "native", "none", "int8", "int4"])
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
