"""Weight-format benchmark: unquantized vs int8 vs int4 on the same model, in one run.

Usage::

    python scripts/bench_quant.py                       # smollm2-135m + qwen2.5-coder-1.5b
    python scripts/bench_quant.py --models smollm2-135m --repeats 3 --json quant.json
    python scripts/bench_quant.py --linear-only         # just the CPU kernel comparison

Models come from the localchat cache (``smollm2-135m`` is fetched if missing; the Qwen model is
skipped with a note when not cached). Formats: ``none`` (the unquantized format: fp32 on this
AVX2 CPU), ``int8``, ``int4`` (group 32 for GGUF sources, the default) and ``int4-g128``.

Per format:

* weight bytes: tensors the loaded model holds (checked equal to ``memory.footprint.weight_bytes``).
* load s first / cached: ``LLMEngine.from_path`` with an empty quantized-weight cache (reads and
  quantizes the checkpoint, writes the cache), then again (reads the cache). The converted GGUF
  metadata and tokenizer come from the user cache both times; ``none`` has no quantized cache,
  so both columns are plain loads.
* decode tok/s: batch 1, greedy, ``--new-tokens`` after a ``--prompt-tokens`` prompt, EOS
  ignored; (n - 1) / (last token time - first token time), median of ``--repeats``.
* GB/s: weight bytes x decode tok/s (every decode step reads every weight once; the tied
  embedding counted once), the achieved memory bandwidth.
* agreement / perplexity: one teacher-forced forward pass over 256 positions of
  ``evaluate.EVAL_TEXT``; agreement is the top-1 match rate with the ``none`` row's logits.

The linear-kernel table (``--linear``, on by default) times one projection call at batch 1 and
at 16 tokens for each of the model's four projection shapes and each CPU method: fp32
``torch.mm`` over the transposed weight (the baseline), int8 ``_weight_int8pack_mm`` (bf16
activations) and dequantize-then-matmul, int4 ``_weight_int4pack_mm_for_cpu`` (bf16
activations) and dequantize-then-matmul; interleaved rounds, the fastest call of each (the
figure least disturbed by other processes on a shared CPU), ratios against fp32.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_decode import cpu_model, param_bytes, prompt_ids, warm_up

MODELS = ["smollm2-135m", "qwen2.5-coder-1.5b"]
FORMATS = {  # label -> (scheme, group size; None = the loader's default)
    "none": ("none", None), "int8": ("int8", None), "int4": ("int4", None),
    "int4-g128": ("int4", 128),
}


def _scratch_cache(user_cache: Path) -> Path:
    """A temporary cache dir sharing the user cache's converted GGUF metadata and tokenizers
    (symlinks) but with an empty quantized-weight cache."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-quant-"))
    for sub in ("gguf-meta", "gguf-tokenizers"):
        if (user_cache / sub).is_dir():
            (tmp / sub).symlink_to(user_cache / sub)
    return tmp


def _held_bytes(model) -> int:
    """Bytes of the loaded weights: parameters, ``weight_t`` copies and quantized buffers
    (the RoPE table excluded)."""
    buffers = {id(b): b for name, b in model.named_buffers()
               if not name.endswith("cos_sin_cache")}
    return param_bytes(model) + sum(b.numel() * b.element_size() for b in buffers.values())


def bench_format(path, label, cache, ids_prompt, eval_ids, ref_logits, args) -> dict:
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.memory.footprint import weight_bytes
    from localchat.engine.quant.evaluate import perplexity, teacher_forced_logits, top1_agreement
    from localchat.engine.sampling_params import SamplingParams

    scheme, group = FORMATS[label]
    config = EngineConfig(
        device="cpu", dtype=torch.float32, quant=QuantConfig(scheme=scheme, group_size=group),
        scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=1),
    )
    loads = []
    engine = None
    for _ in range(2):  # first (quantize + write cache), then cached
        engine = None
        gc.collect()
        t0 = time.perf_counter()
        engine = LLMEngine.from_path(path, config, cache_dir=cache)
        loads.append(time.perf_counter() - t0)
    model = engine.runner.model
    held = _held_bytes(model)
    group_used = 128 if group else (32 if path.suffix == ".gguf" else 128)
    predicted = weight_bytes(engine.model_config, scheme, "cpu", torch.float32, group_used)

    def run(prompt, n):
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return list(engine.generate(prompt, params))[-1]

    warm_up(run, ids_prompt)
    decode = []
    for _ in range(args.repeats):
        out = run(ids_prompt, args.new_tokens)
        m = out.metrics
        decode.append((out.num_output_tokens - 1) / (m.last_token_time - m.first_token_time))
    logits = teacher_forced_logits(model, eval_ids)
    tps = statistics.median(decode)
    row = {
        "format": label, "weight_bytes": held, "weight_bytes_predicted": predicted,
        "load_first_s": loads[0], "load_cached_s": loads[1],
        "cache_hit": bool(getattr(model, "quant_cache_hit", False)),
        "decode_tok_s": tps, "decode_gb_s": held * tps / 1e9, "decode_samples": decode,
        "perplexity": perplexity(logits, eval_ids),
        "agreement": None if ref_logits is None else top1_agreement(logits[:-1], ref_logits[:-1]),
    }
    engine = model = None
    gc.collect()
    return row, logits


def _timeit(fn, repeats=15) -> float:
    """Fastest of ``repeats`` calls (seconds): on a shared CPU the minimum is the figure least
    disturbed by other processes."""
    fn()
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples)


def bench_linear(model_config, rounds: int = 3) -> list[dict]:
    """Per projection shape and token count: microseconds per call of each CPU method."""
    from localchat.engine.layers.linear import Linear
    from localchat.engine.memory.footprint import linear_shapes
    from localchat.engine.quant.methods import make_linear_method
    from localchat.engine.quant.schemes import QuantScheme

    names = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    methods = {
        "fp32": (QuantScheme.NONE, "packed"), "int8-packed": (QuantScheme.INT8, "packed"),
        "int8-dequant": (QuantScheme.INT8, "dequant"),
        "int4-packed": (QuantScheme.INT4, "packed"), "int4-dequant": (QuantScheme.INT4, "dequant"),
    }
    rows = []
    for name, (n, k) in zip(names, linear_shapes(model_config)):
        layers = {}
        w = torch.randn(n, k) * 0.02
        for label, (scheme, kernel) in methods.items():
            layer = Linear(k, n)
            layer.weight.data.copy_(w)
            layer.quant_method = make_linear_method(scheme, "cpu", k, 128, kernel)
            layer.quant_method.quantize_weights(layer)
            layer.process_weights_after_loading()
            layers[label] = layer
        for m in (1, 16):
            x = torch.randn(m, k)
            times = {label: [] for label in layers}
            with torch.inference_mode():
                for _ in range(rounds):  # interleaved so load changes hit every method alike
                    for label, layer in layers.items():
                        times[label].append(_timeit(lambda layer=layer, x=x: layer(x)))
            row = {"proj": name, "N": n, "K": k, "tokens": m}
            row.update({label: min(t) * 1e6 for label, t in times.items()})
            rows.append(row)
    return rows


def print_tables(results: dict) -> None:
    for model, rows in results["formats"].items():
        print(f"\n{model}")
        head = ["format", "weight MB", "load first s", "load cached s", "decode tok/s",
                "vs none", "GB/s", "top-1 agree", "perplexity"]
        base = next((r["decode_tok_s"] for r in rows if r["format"] == "none"), None)
        lines = [head]
        for r in rows:
            lines.append([
                r["format"], f"{r['weight_bytes'] / 1e6:.1f}", f"{r['load_first_s']:.1f}",
                f"{r['load_cached_s']:.1f}", f"{r['decode_tok_s']:.1f}",
                f"{r['decode_tok_s'] / base:.2f}x" if base else "-",
                f"{r['decode_gb_s']:.2f}",
                "-" if r["agreement"] is None else f"{100 * r['agreement']:.1f}%",
                f"{r['perplexity']:.2f}",
            ])
        _print(lines)
    for model, rows in results.get("linear", {}).items():
        print(f"\n{model}: microseconds per projection call (ratio vs fp32)")
        labels = [k for k in rows[0] if k not in ("proj", "N", "K", "tokens")]
        lines = [["proj", "N x K", "tokens", *labels]]
        for r in rows:
            lines.append([r["proj"], f"{r['N']}x{r['K']}", str(r["tokens"]),
                          *[f"{r[lab]:.0f} ({r['fp32'] / r[lab]:.2f}x)" for lab in labels]])
        _print(lines)


def _print(lines) -> None:
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    for i, row in enumerate(lines):
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-linear", action="store_true", help="skip the linear-kernel table")
    ap.add_argument("--linear-only", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.loader import load_model_config
    from localchat.engine.quant.evaluate import EVAL_TEXT
    from localchat.engine.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    user_cache = cache_dir()
    print(f"workload: {cpu_model()}, {args.threads} threads, torch {torch.__version__}; "
          f"prompt {args.prompt_tokens} tokens, {args.new_tokens} greedy new tokens, batch 1, "
          f"{args.repeats} repeats (medians); agreement/perplexity over 256 positions")
    results: dict = {"formats": {}, "linear": {}, "threads": args.threads, "cpu": cpu_model()}
    for alias in args.models:
        if alias != "smollm2-135m" and not (user_cache / "models" / alias).exists():
            print(f"{alias}: not in the cache, skipped (fetch it with `localchat pull {alias}`)")
            continue
        path = resolve_model(alias, cache_dir=user_cache).path
        model_config = load_model_config(path, user_cache)
        if not args.no_linear:
            print(f"{alias}: linear kernels ...", flush=True)
            results["linear"][alias] = bench_linear(model_config)
        if args.linear_only:
            continue
        tok = Tokenizer.from_pretrained(path, cache_dir=user_cache)
        ids_prompt = prompt_ids(tok, args.prompt_tokens)
        eval_ids = tok.encode(EVAL_TEXT)[:257]
        rows, ref = [], None
        scratch = _scratch_cache(user_cache)
        for label in args.formats:
            print(f"{alias}: {label} ...", flush=True)
            row, logits = bench_format(path, label, scratch, ids_prompt, eval_ids, ref, args)
            if label == "none":
                ref = logits
                row["agreement"] = 1.0
            rows.append(row)
        results["formats"][alias] = rows
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
