"""Stage 3 of ``gpu_check.sh``: end-to-end decode through ``LLMEngine`` on random Llama-3.1-8B weights.

The engine is built as ``engine_build.build_engine`` builds it, minus the file loading: the
model is ``models.llama.LlamaForCausalLM`` with Llama-3.1-8B's shapes (all 32 layers, 16 GB at
bf16; ``gpu_bench_e2e.model_config``), random weights (``gpu_bench_e2e.build_model``; fp8 /
int8 / int4 replace the decoder projections' weights with random packed ones,
``gpu_bench_e2e.quantize_random``), an offline tokenizer (a word-level ``tokenizers`` vocabulary
of the model's 128256 ids, written to a temporary folder and read by
``tokenizer_files.TokenizerFiles``: no download), and on CUDA the KV pool sized by
``memory.kv_pools.plan_cuda_pools`` from ``torch.cuda.mem_get_info`` (the measured activation
peak and the CUDA-graph pool included); the engine then captures its decode graphs. Prompts are
token ids (``add_request``), greedy, ``ignore_eos``.

For each weight format: decode tok/s at each batch size over ``--context``-token prompts
(``--steps`` timed ``engine.step()`` calls after every request is decoding), the bandwidth it
implies ((weight bytes + KV bytes read) per step x steps/s) as % of the device copy bandwidth
measured in the same run, and per step: wall ms and the ms outside the model forward (host
scheduling, input staging, sampling, detokenizing: step wall minus the forward's GPU time,
CUDA events around ``ModelRunner._forward``). At bf16 also: TTFT of a cold 2048-token prompt vs
a prompt sharing its first 1984 tokens (prefix cache hit, checked through
``num_cached_tokens``), and the speculative verification cost: with a 1-layer random draft
(k = 4, adaptive off) the target's ``execute_model`` time per step over a plain decode step's.
Acceptance is meaningless with random weights and is not reported. Side by side: transformers'
``LlamaForCausalLM`` built from a ``LlamaConfig`` (no download) holding the same weights (copied
from the engine's model), ``generate`` greedy decode tok/s at batch 1 (a clear skip line when
transformers is missing).

Results are rewritten to ``engine.json`` / ``engine.md`` after every row. ``--tiny --device
cpu`` runs a scaled-down model through the same code on CPU (the dry run and
``tests/engine/test_gpu_engine_script.py``); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench_e2e import (
    build_model,
    copy_peak,
    model_config,
    quantize_random,
    weight_bytes_per_step,
)
from gpu_engine_probes import decode_run, spec_verify_cost, ttft
from gpu_hf_side import greedy_agreement, hf_generate

from localchat.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    QuantConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.memory.footprint import kv_bytes
from localchat.engine.quant import QuantScheme
from localchat.engine.quant.schemes import fp8_supported
from localchat.engine.tokenizer import Tokenizer
from localchat.engine.tokenizer_files import TokenizerFiles

SCHEMES = {"bf16": QuantScheme.NONE, "fp8": QuantScheme.FP8, "int8": QuantScheme.INT8,
           "int4": QuantScheme.INT4}


def offline_tokenizer(vocab_size: int, folder: Path) -> Tokenizer:
    """A word-level tokenizer of ``vocab_size`` ids (``t0`` .. ``t{V-2}``, EOS ``</s>`` last),
    saved to ``folder`` and read back with the ``tokenizers`` library alone."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab["</s>"] = vocab_size - 1
    backend = Backend(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    backend.add_special_tokens(["</s>"])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return Tokenizer(TokenizerFiles(folder))


def engine_config(device, args, scheme_name: str, spec_k: int = 0) -> EngineConfig:
    cache = CacheConfig() if device.type == "cuda" else CacheConfig(
        kv_cache_memory_bytes=64 * 2**20)
    return EngineConfig(
        device=str(device), dtype=torch.bfloat16, cache=cache,
        scheduler=SchedulerConfig(max_num_seqs=max(args.batch_list), max_model_len=args.max_model_len,
                                  max_num_batched_tokens=2048),
        quant=QuantConfig(scheme=scheme_name if scheme_name != "bf16" else "none"),
        speculative=SpeculativeConfig(num_speculative_tokens=spec_k, adaptive=False)
        if spec_k else SpeculativeConfig())


def make_engine(model, cfg: ModelConfig, tok: Tokenizer, config: EngineConfig,
                max_model_len: int, draft=None, draft_cfg: ModelConfig | None = None
                ) -> tuple[LLMEngine, dict]:
    """``build_engine``'s wiring for an in-memory model: on CUDA the KV pools from
    ``plan_cuda_pools`` (free memory after the target's and the draft's weights, less measured
    activations, graph pool and margin, split between the target's pool and the draft's); on
    CPU ``plan_num_blocks`` under the config's byte budget. The draft (if any) is not attached:
    ``spec_verify_cost`` attaches it."""
    plan_info: dict = {}
    if config.resolved_device().type == "cuda":
        from localchat.engine.memory.kv_pools import plan_cuda_pools

        free0 = torch.cuda.mem_get_info()[0]
        config, plan = plan_cuda_pools(model, cfg, draft, draft_cfg, config, max_model_len)
        plan_info = {"free_bytes_before_plan": free0, "num_blocks": config.cache.num_blocks,
                     "plan": repr(plan)[:400]}
    engine = LLMEngine(model, cfg, tok, config, max_model_len, model_name="random-llama")
    plan_info["num_blocks"] = engine.num_blocks
    plan_info["graphs"] = engine.runner.graphs is not None
    return engine, plan_info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="scaled-down model (script check)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count")
    ap.add_argument("--schemes", default="bf16,fp8,int8,int4")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=64, help="timed engine steps")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    ap.add_argument("--no-extras", action="store_true", help="skip TTFT and speculative rows")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_engine_e2e: error: CUDA is not available", file=sys.stderr)
        return 2
    args.batch_list = [int(b) for b in args.batch_sizes.split(",")]
    cfg = model_config(args.tiny)
    if args.layers:
        import dataclasses

        cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"workload: LLMEngine on random {'tiny' if args.tiny else 'Llama-3.1-8B'} weights "
          f"({cfg.num_hidden_layers} layers), {args.context}-token prompts, {args.steps} timed "
          f"steps, batch {args.batch_list}, device {name}, torch {torch.__version__}", flush=True)
    peak = copy_peak(device)
    print(f"copy peak: {peak / 1e9:.1f} GB/s (read + write)", flush=True)
    tmp = tempfile.TemporaryDirectory()
    tok = offline_tokenizer(cfg.vocab_size, Path(tmp.name) / "tokenizer")
    result: dict = {"device": name, "torch": torch.__version__, "copy_peak_GBps": peak / 1e9,
                    "layers": cfg.num_hidden_layers, "rows": [], "plans": {}}

    def write() -> None:
        md = [("| weights | batch | tok/s | ms/step | ms/step outside the forward | weight GB "
               "| GB/s | % of copy peak |"), "|---|---|---|---|---|---|---|---|"]
        for r in result["rows"]:
            md.append(f"| {r['weights']} | {r['batch']} | {r['tok_per_s']:.1f} | "
                      f"{r['ms_per_step']:.2f} | {r['non_forward_ms_per_step']:.2f} | "
                      f"{r['weight_GB']:.2f} | {r['GB_per_s']:.0f} | "
                      f"{r['pct_of_copy_peak']:.0f} |")
        hf = result.get("hf_generate")
        if hf:
            md += ["", "transformers generate, batch 1: " + (
                f"{hf['tok_per_s']:.1f} tok/s (transformers {hf['transformers']}; leading "
                f"greedy tokens equal to the engine's at bf16: "
                f"{hf.get('greedy_tokens_equal_to_engine_bf16', '?')})"
                if "tok_per_s" in hf else f"skipped: {hf['skipped']}")]
            b1 = next((r for r in result["rows"] if r["weights"] == "bf16"
                       and r["batch"] == 1), None)
            if b1 and "tok_per_s" in hf:
                md.append(f"engine bf16 batch 1 / transformers: "
                          f"{b1['tok_per_s'] / hf['tok_per_s']:.2f}x")
        for key in ("ttft", "speculative"):
            if key in result:
                md += ["", f"{key}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in result[key].items())]
        md += ["", f"Copy peak {peak / 1e9:.0f} GB/s; {cfg.num_hidden_layers} layers."]
        result["md"] = md
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "engine.json").write_text(json.dumps(result, indent=1, default=str))
            (args.out / "engine.md").write_text("\n".join(md) + "\n")

    model = build_model(cfg, torch.bfloat16, device, args.max_model_len)
    failed = False
    if args.no_hf:
        result["hf_generate"] = {"skipped": "--no-hf"}
    else:
        try:
            result["hf_generate"] = hf_generate(model, cfg, args, device)
        except Exception as err:  # noqa: BLE001 (a transformers API change must not end the stage)
            result["hf_generate"] = {"skipped": f"failed: {type(err).__name__}: {err}"[:300]}
        print("  transformers generate: " + str({k: v for k, v in result["hf_generate"].items()
                                                  if k not in ("prompt", "tokens")}), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write()

    names = args.schemes.split(",")
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        print(f"gpu_engine_e2e: error: unknown weight format {unknown[0]!r}", file=sys.stderr)
        return 2
    # bf16 first: the quantized formats replace the float weights in place.
    for scheme_name in sorted(set(names), key=list(SCHEMES).index):
        scheme = SCHEMES[scheme_name]
        if scheme is QuantScheme.FP8 and device.type == "cuda" and not fp8_supported(device):
            print("  fp8   skipped: needs compute capability 8.9+", flush=True)
            continue
        if scheme is not QuantScheme.NONE:
            quantize_random(model, scheme, device)
        model.quant_scheme = scheme
        wbytes = weight_bytes_per_step(model)
        engine = draft = dcfg = None
        extras = scheme is QuantScheme.NONE and not args.no_extras
        try:
            t0 = time.perf_counter()
            if extras:  # a 1-layer random draft, loaded before the plan (build_engine's order)
                import dataclasses

                dcfg = dataclasses.replace(cfg, num_hidden_layers=1)
                draft = build_model(dcfg, torch.bfloat16, device, args.max_model_len)
            engine, plan = make_engine(model, cfg, tok, engine_config(device, args, scheme_name),
                                       args.max_model_len, draft, dcfg)
            plan["build_s"] = time.perf_counter() - t0
            result["plans"][scheme_name] = plan
            print(f"  {scheme_name}: engine built in {plan['build_s']:.1f} s, "
                  f"{plan['num_blocks']} KV blocks, graphs {plan['graphs']}", flush=True)
            for i, bs in enumerate(args.batch_list):
                r = decode_run(engine, bs, args.context, args.steps, cfg.vocab_size, seed=i)
                avg_len = args.context + args.steps / 2
                step_bytes = wbytes + bs * avg_len * kv_bytes(cfg, 1, torch.bfloat16)
                bw = step_bytes * args.steps / r["wall_s"]
                row = {"weights": scheme_name, "batch": bs, "running": r["running"],
                       "tok_per_s": bs * args.steps / r["wall_s"],
                       "ms_per_step": 1e3 * r["wall_s"] / args.steps,
                       "median_step_ms": 1e3 * r["median_step_s"],
                       "forward_ms_per_step": 1e3 * r["forward_s"] / args.steps,
                       "non_forward_ms_per_step": 1e3 * (r["wall_s"] - r["forward_s"])
                       / args.steps,
                       "weight_GB": wbytes / 1e9, "GB_per_s": bw / 1e9,
                       "pct_of_copy_peak": 100 * bw / peak}
                result["rows"].append(row)
                print(f"  {scheme_name:5s} batch {bs:3d} ({r['running']} running) "
                      f"{row['tok_per_s']:9.1f} tok/s {row['ms_per_step']:8.2f} ms/step "
                      f"(outside the forward {row['non_forward_ms_per_step']:.2f}) "
                      f"{row['GB_per_s']:8.1f} GB/s {row['pct_of_copy_peak']:5.1f}% of copy",
                      flush=True)
                write()
            hf = result.get("hf_generate") or {}
            if scheme is QuantScheme.NONE and "tokens" in hf:
                n = greedy_agreement(engine, hf.pop("prompt"), hf["tokens"])
                hf["greedy_tokens_equal_to_engine_bf16"] = f"{n} of {len(hf.pop('tokens'))}"
                print(f"  greedy tokens equal to transformers': "
                      f"{hf['greedy_tokens_equal_to_engine_bf16']}", flush=True)
                write()
            if extras:
                gen = torch.Generator().manual_seed(5)
                n = min(2048, engine.max_model_len - 8)
                base = torch.randint(0, cfg.vocab_size - 1, (n,), generator=gen).tolist()
                tail = torch.randint(0, cfg.vocab_size - 1, (64,), generator=gen).tolist()
                cold, c0 = ttft(engine, base)
                cached, c1 = ttft(engine, base[: n - 64] + tail)
                result["ttft"] = {"prompt_tokens": n, "cold_ms": 1e3 * cold,
                                  "prefix_cached_ms": 1e3 * cached, "cached_tokens": c1,
                                  "speedup": cold / cached}
                print(f"  TTFT {n} tokens: cold {1e3 * cold:.1f} ms ({c0} cached), "
                      f"with {c1} cached {1e3 * cached:.1f} ms", flush=True)
                write()
                result["speculative"] = spec_verify_cost(engine, cfg, draft, dcfg, args)
                print(f"  speculative: {result['speculative']}", flush=True)
                write()
        except Exception as err:  # noqa: BLE001 (record it, go on with the next format)
            failed = True
            result.setdefault("errors", {})[scheme_name] = f"{type(err).__name__}: {err}"[:500]
            print(f"  {scheme_name} FAILED: {type(err).__name__}: {err}", flush=True)
            import traceback

            traceback.print_exc()
            write()
        finally:
            del engine, draft
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    write()
    print("\n".join(result["md"]))
    tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
