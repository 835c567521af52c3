"""Prefix-caching and continuous-batching benchmark (issue: paged KV cache).

Usage::

    python scripts/bench_prefix.py                       # smollm2-135m (+ qwen2.5-coder-0.5b if cached)
    python scripts/bench_prefix.py --models smollm2-135m --turns 10 --json prefix.json
    python scripts/bench_prefix.py --dtype auto --concurrency-only   # the engine's own CPU choice

Weights are ``--quant auto`` (the GGUF's own format on CPU where the C++ kernels are built);
activations fp32 unless ``--dtype bfloat16``, or ``--dtype auto``: what ``ask`` and ``serve``
pick (bf16 on a CPU with native bf16, else fp32 decoding through the integer-dot kernels).

1. A 10-turn conversation growing to about 2,000 tokens. Each turn appends a ~150-token user
   message; the reply (greedy, up to ``--reply-tokens``) is generated once, with prefix
   caching, and the same messages are then replayed in every mode, so all modes see identical
   contexts. Per turn, time to first token (TTFT, seconds) is measured:

   * ``cached``: our engine with prefix caching (the earlier turns' blocks are reused);
   * ``recompute``: the same engine with its prefix cache emptied before each turn;
   * ``transformers``: ``generate(max_new_tokens=1)`` on the whole history (transformers'
     own Llama/Qwen2 on the same dequantized GGUF weights, same dtype and thread count).

   Also reported: ``cached_tokens`` of each turn as a share of the previous turn's context
   (prompt + reply). Targets: turn-10 TTFT at least 10x below recompute; cached share >= 95%.

2. 8 concurrent requests (different prompts, 64 greedy tokens each, EOS ignored): total
   generated tokens/s when all 8 are submitted at once (continuous batching) against the 8
   run one after another, on the same engine; whole requests (their prompts' prefill
   included), and decode alone (batched: the tokens after every request has its first one,
   over that window; sequential: each request's tokens after its first, over its decode
   time).

All figures come from one process on one machine; ratios compare modes measured in the same
run. Our TTFT is ``RequestOutput.metrics.ttft`` (``add_request`` to first token, perf_counter);
transformers' is the wall time of ``generate`` with one new token (prefill + one step).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import cpu_model

NOTES = (
    "Paged attention stores keys and values in fixed-size blocks. A block table maps each "
    "sequence position to a physical block, so memory is allocated on demand instead of "
    "reserved for the longest possible context. When two requests share a prefix, such as a "
    "system prompt or the earlier turns of a conversation, their block tables can point to the "
    "same physical blocks, and the shared tokens are computed only once. A scheduler decides "
    "each step which requests run; when memory runs out it preempts the newest request and "
    "recomputes it later. "
)


def user_message(turn: int) -> str:
    return (f"Part {turn + 1} of my notes follows. {NOTES}"
            f"Question {turn + 1}: in one sentence, what is the key idea of part {turn + 1}?")


def load(model: str, dtype: torch.dtype):
    from localchat.app.settings import cache_dir
    from localchat.engine.config import EngineConfig, SchedulerConfig
    from localchat.engine.hub.resolve import is_cached, resolve_model
    from localchat.engine.llm_engine import LLMEngine

    if model != "smollm2-135m" and not is_cached(model, cache_dir()):
        return None, None
    source = resolve_model(model, cache_dir=cache_dir(), download=True)
    config = EngineConfig(device="cpu", dtype=dtype,
                          scheduler=SchedulerConfig(max_model_len=4096, max_num_seqs=8))
    return LLMEngine.from_source(source, config, cache_dir=cache_dir()), source.path


def run_one(eng, ids, max_tokens=None, params=None):
    """The final ``RequestOutput`` of one request run alone (greedy unless ``params``)."""
    from localchat.engine.sampling_params import SamplingParams

    params = params or SamplingParams(temperature=0.0, max_tokens=max_tokens)
    *_, last = eng.generate(ids, params)
    return last


def conversation(eng, turns: int, reply_tokens: int):
    """Run the conversation with caching; return per-turn (messages, prompt ids, output)."""
    messages: list[dict] = [{"role": "system", "content": "You are a concise assistant."}]
    rows = []
    for t in range(turns):
        messages.append({"role": "user", "content": user_message(t)})
        ids = eng.tokenizer.apply_chat_template(messages)
        last = run_one(eng, ids, reply_tokens)
        rows.append((list(messages), ids, last))
        messages.append({"role": "assistant", "content": last.text})
    return rows


def ttft_recompute(eng, rows):
    out = []
    for _, ids, _ in rows:
        eng.reset_prefix_cache()
        out.append(run_one(eng, ids, 1).metrics.ttft)
    return out


def ttft_transformers(path: Path, dtype, rows):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=dtype).eval()
    out = []
    with torch.inference_mode():
        model.generate(torch.tensor([rows[0][1][:32]]), max_new_tokens=2, do_sample=False)
        for _, ids, _ in rows:
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1,
                           do_sample=False)
            out.append(time.perf_counter() - t0)
    del model
    gc.collect()
    return out


def concurrency(eng, n: int = 8, tokens: int = 64) -> dict:
    """Tokens/s of ``n`` requests run one after another against all submitted at once, whole
    requests (prompts included) and in decode alone: sequential, each request's tokens after
    its first over first -> last token; batched, the tokens generated after every request has
    its first one over that window (the steady state of ``n`` decoding streams)."""
    from localchat.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompts = [eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a short poem about the number {i}."}])
        for i in range(n)]
    eng.reset_prefix_cache()
    t0 = time.perf_counter()
    decode_tokens = decode_time = 0.0
    for ids in prompts:
        metrics = run_one(eng, ids, params=params).metrics
        decode_tokens += metrics.num_output_tokens - 1
        decode_time += metrics.decode_time
    sequential = n * tokens / (time.perf_counter() - t0)
    eng.reset_prefix_cache()
    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        eng.add_request(f"c{i}", ids, params)
    started: set[str] = set()
    t_all, after = None, 0
    while eng.has_unfinished_requests():
        outs = eng.step()
        new = sum(len(out.new_token_ids) for out in outs)
        started.update(out.request_id for out in outs if out.new_token_ids)
        if t_all is not None:
            after += new
        elif len(started) == n:
            t_all = time.perf_counter()
    t1 = time.perf_counter()
    return {"concurrent8_tok_s": n * tokens / (t1 - t0), "sequential8_tok_s": sequential,
            "concurrent8_decode_tok_s": after / (t1 - t_all) if t_all and t1 > t_all else None,
            "sequential8_decode_tok_s": decode_tokens / decode_time if decode_time else None}


def bench(model: str, args) -> dict | None:
    eng, path = load(model, None if args.dtype == "auto" else getattr(torch, args.dtype))
    if eng is None:
        print(f"# {model}: not in the localchat cache, skipped", file=sys.stderr)
        return None
    run_one(eng, eng.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]), 4)
    if args.concurrency_only:
        result = {"model": model, **concurrency(eng)}
        del eng
        gc.collect()
        return result
    rows = conversation(eng, args.turns, args.reply_tokens)
    cached_ttft = [r[2].metrics.ttft for r in rows]
    cached_tokens = [r[2].num_cached_tokens for r in rows]
    prev_context = [0] + [len(r[1]) + r[2].num_output_tokens for r in rows[:-1]]
    recompute = ttft_recompute(eng, rows)
    hf = ttft_transformers(path, eng.dtype, rows) if not args.no_transformers else None
    result = {
        "model": model, "prompt_tokens": [len(r[1]) for r in rows],
        "ttft_cached_s": cached_ttft, "ttft_recompute_s": recompute,
        "ttft_transformers_s": hf, "cached_tokens": cached_tokens,
        "cached_share_of_previous_context": [
            c / p if p else None for c, p in zip(cached_tokens, prev_context)],
        **concurrency(eng),
    }
    del eng
    gc.collect()
    return result


def table(res: dict) -> str:
    lines = [f"### {res['model']}", ""]
    if "prompt_tokens" in res:
        lines += _turn_rows(res)
    lines.append(f"8 concurrent requests x 64 tokens: {res['concurrent8_tok_s']:.1f} tok/s "
                 f"batched vs {res['sequential8_tok_s']:.1f} tok/s sequential "
                 f"({res['concurrent8_tok_s'] / res['sequential8_tok_s']:.2f}x)")
    cd, sd = res.get("concurrent8_decode_tok_s"), res.get("sequential8_decode_tok_s")
    if cd and sd:
        lines.append(f"  decode alone (after every request's first token): {cd:.1f} tok/s "
                     f"batched vs {sd:.1f} tok/s sequential ({cd / sd:.2f}x)")
    return "\n".join(lines)


def _turn_rows(res: dict) -> list[str]:
    lines = [("| turn | prompt tokens | cached tokens (share of prev. context) | TTFT cached s | "
              "TTFT recompute s | TTFT transformers s | recompute / cached |"),
             "|---|---|---|---|---|---|---|"]
    hf = res["ttft_transformers_s"] or [None] * len(res["prompt_tokens"])
    for i, p in enumerate(res["prompt_tokens"]):
        share = res["cached_share_of_previous_context"][i]
        share_s = "-" if share is None else f"{share:.0%}"
        c, r = res["ttft_cached_s"][i], res["ttft_recompute_s"][i]
        h = "-" if hf[i] is None else f"{hf[i]:.3f}"
        lines.append(f"| {i + 1} | {p} | {res['cached_tokens'][i]} ({share_s}) | {c:.3f} | "
                     f"{r:.3f} | {h} | {r / c:.1f}x |")
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--reply-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "auto"], default="float32",
                    help="activation dtype, auto: the engine's choice (weights: --quant auto, "
                    "native on a GGUF)")
    ap.add_argument("--concurrency-only", action="store_true",
                    help="only the 8 concurrent vs sequential requests")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {cpu_model()}, {args.threads} threads, torch {torch.__version__}, {args.dtype}")
    results = []
    for model in args.models:
        res = bench(model, args)
        if res is not None:
            results.append(res)
            print(table(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    for res in results:
        if "prompt_tokens" not in res:
            continue
        last = res["ttft_recompute_s"][-1] / res["ttft_cached_s"][-1]
        share = statistics.mean(s for s in res["cached_share_of_previous_context"] if s)
        print(f"# {res['model']}: turn-{len(res['prompt_tokens'])} TTFT {last:.1f}x below "
              f"recompute; mean cached share {share:.1%}")


if __name__ == "__main__":
    main()
