"""Speculative decoding benchmark: Qwen2.5-Coder-1.5B with the 0.5B draft, against no draft.

Usage::

    python scripts/bench_spec.py                          # 5 code + 5 chat prompts, 256 tokens
    python scripts/bench_spec.py --max-tokens 64 --prompts 2 --json spec.json
    python scripts/bench_spec.py --draft ngram --classes edit code chat   # prompt lookup

``--draft ngram`` drafts by prompt lookup (``engine/spec_decode/ngram.py``, no draft model);
the ``edit`` class (``--classes``) asks for a small change to a pasted snippet, the reply that
copies its input, where such drafts are accepted.

Both models come from the localchat cache (``localchat pull qwen2.5-coder-1.5b`` and
``qwen2.5-coder-0.5b``; nothing is downloaded here). One process, one target model in memory:
the plain engine and the speculative engine share the target's weights, so they differ only
by the draft. For every prompt and each temperature (0, and 0.7 with a fixed seed) it runs
the request without and with the draft and reports decode tokens/s
(``(tokens - 1) / (last token time - first token time)``, from ``RequestOutput.metrics``), the
ratio, the acceptance rate (accepted / drafted tokens) and the mean accepted length (tokens
emitted per verification step). ``--fixed-k`` turns the adaptive draft length off, to show the
raw cost of always drafting k tokens; ``--draft-vocab N`` sets the draft's vocabulary
(``SpeculativeConfig.draft_vocab_size``; 0: the whole vocabulary); ``--rounds N`` runs each
prompt N times in each mode, alternating, and keeps the best of each (a shared machine's
bandwidth moves between runs).
Targets (the issue): >= 1.5x on code prompts at temperature 0, >= 0.97x on every prompt
class.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import cpu_model

from localchat.engine.config import SpeculativeConfig

SPEC_DEFAULTS = SpeculativeConfig()

CODE = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function to merge two sorted lists into one sorted list.",
    "Implement binary search in Python and explain its complexity in one line.",
    "Write a bash one-liner that counts lines in all .py files under the current directory.",
    "Write a Python class for a stack with push, pop and peek methods.",
]
_SNIPPET = """def parse_args(argv):
    parser = argparse.ArgumentParser(description="Copy files between folders.")
    parser.add_argument("source", help="the folder to copy from")
    parser.add_argument("target", help="the folder to copy into")
    parser.add_argument("--dry-run", action="store_true", help="only print what would be copied")
    parser.add_argument("--verbose", action="store_true", help="print every file copied")
    return parser.parse_args(argv)
"""
EDIT = [
    f"{_SNIPPET}\nRename the variable parser to p. Output only the code.",
    f"{_SNIPPET}\nAdd type hints to this function. Output only the code.",
    f"{_SNIPPET}\nAdd a --quiet flag like --verbose to this function. Output only the code.",
    f"{_SNIPPET}\nRename the function to build_parser. Output only the code.",
    f"{_SNIPPET}\nAdd a docstring to this function. Output only the code.",
]
CHAT = [
    "Give me three tips for sleeping better.",
    "Explain what a black hole is to a ten-year-old.",
    "What are the pros and cons of working from home?",
    "Write a short poem about autumn leaves.",
    "How do I politely decline a meeting invitation?",
]


def load(args):
    from localchat.app.settings import cache_dir
    from localchat.engine.config import EngineConfig, SchedulerConfig, SpeculativeConfig
    from localchat.engine.hub.resolve import is_cached, resolve_model
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.spec_decode.speculator import Speculator

    ngram = args.draft == "ngram"
    for name in (args.target, *(() if ngram else (args.draft,))):
        if not is_cached(name, cache_dir()):
            sys.exit(f"bench_spec: {name} is not cached; run: localchat pull {name}")
    target = resolve_model(args.target, cache_dir=cache_dir(), download=False)
    draft = None if ngram else resolve_model(args.draft, cache_dir=cache_dir(),
                                             download=False)
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    config = EngineConfig(device="cpu", dtype=dtype,
                          scheduler=SchedulerConfig(max_model_len=2048),
                          speculative=SpeculativeConfig(
                              draft_model=None if ngram else str(draft.path),
                              method="ngram" if ngram else "draft_model",
                              num_speculative_tokens=args.k, adaptive=not args.fixed_k,
                              draft_vocab_size=args.draft_vocab or None))
    plain = LLMEngine.from_source(target, dataclasses.replace(
        config, speculative=SpeculativeConfig()), cache_dir=cache_dir())
    # the weight format the plain engine resolved (``auto`` -> native for a GGUF on CPU), so
    # the draft loads in it too, as ``ask --draft`` does (engine_build resolves before both)
    config = dataclasses.replace(config, quant=plain.config.quant)
    spec = LLMEngine(plain.runner.model, plain.model_config, plain.tokenizer, config,
                     plain.max_model_len)
    if ngram:
        spec.speculator = Speculator.build_ngram(plain.model_config, config, spec.max_model_len)
    else:
        spec.speculator = Speculator.load(Path(draft.path), plain.model_config, config,
                                          spec.num_blocks * config.cache.block_size,
                                          spec.max_model_len, cache_dir=cache_dir())
    return plain, spec


def run(eng, ids, temperature: float, max_tokens: int):
    from localchat.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=7,
                            ignore_eos=True)
    eng.reset_prefix_cache()
    *_, last = eng.generate(ids, params)
    m = last.metrics
    tok_s = (last.num_output_tokens - 1) / m.decode_time if m.decode_time else float("nan")
    return tok_s, m.num_draft_tokens, m.num_accepted_tokens, last.num_output_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b",
                    help="draft model, or ngram (prompt lookup)")
    ap.add_argument("--classes", nargs="+", choices=["code", "chat", "edit"],
                    default=["code", "chat"], help="prompt classes, in this order")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=5, help="prompts per class (max 5)")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--fixed-k", action="store_true", help="always draft k (no adaptation)")
    ap.add_argument("--draft-vocab", type=int,
                    default=SPEC_DEFAULTS.draft_vocab_size or 0,
                    help="the draft's vocabulary, its first N token ids (0: all)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="activation dtype (auto: the engine's CPU default, what `ask` runs)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="plain / speculative runs per prompt, alternating; the best of each "
                    "(the bandwidth of a shared machine moves between runs)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    torch.set_num_threads(args.threads)
    plain, spec = load(args)
    tok = plain.tokenizer
    warm = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    run(plain, warm, 0.0, 8)
    run(spec, warm, 0.0, 8)
    print(f"# {cpu_model()}, {args.threads} threads, {str(plain.dtype).removeprefix('torch.')}, "
          f"weights {plain.get_info().weight_format}, {args.target} + draft {args.draft}, "
          f"k={args.k}{' fixed' if args.fixed_k else ' adaptive'}, draft vocabulary "
          f"{args.draft_vocab or 'all'}, {args.max_tokens} tokens")
    print("| class | T | prompt | plain tok/s | draft tok/s | speedup | acceptance | "
          "mean accepted length |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    sets = {"code": CODE, "chat": CHAT, "edit": EDIT}
    for cls, prompts in ((c, sets[c][:args.prompts]) for c in args.classes):
        for temp in args.temperatures:
            for i, text in enumerate(prompts):
                ids = tok.apply_chat_template([{"role": "user", "content": text}])
                # rounds alternate plain and speculative runs; the best of each is kept
                base, best = 0.0, None
                for _ in range(args.rounds):
                    base = max(base, run(plain, ids, temp, args.max_tokens)[0])
                    got = run(spec, ids, temp, args.max_tokens)
                    best = got if best is None or got[0] > best[0] else best
                fast, drafted, accepted, n = best
                steps = max(n - 1 - accepted, 1)  # verification steps after the first token
                rate = accepted / drafted if drafted else 0.0
                row = {"class": cls, "temperature": temp, "prompt": i, "plain_tok_s": base,
                       "spec_tok_s": fast, "speedup": fast / base, "acceptance": rate,
                       "mean_accepted_length": (n - 1) / steps, "drafted": drafted}
                rows.append(row)
                print(f"| {cls} | {temp} | {i + 1} | {base:.2f} | {fast:.2f} | "
                      f"{fast / base:.2f}x | {rate:.0%} | {row['mean_accepted_length']:.2f} |",
                      flush=True)
    print()
    for cls in args.classes:
        for temp in args.temperatures:
            sel = [r["speedup"] for r in rows if r["class"] == cls and r["temperature"] == temp]
            if sel:
                geo = math.exp(sum(math.log(s) for s in sel) / len(sel))
                print(f"# {cls} T={temp}: geometric-mean speedup {geo:.2f}x, "
                      f"min {min(sel):.2f}x over {len(sel)} prompts")
    ctl = spec.speculator.controller
    verify = ", ".join(f"k={k}: {t:.3f} s" for k, t in sorted(ctl.t_verify.items()))
    print(f"# measured step costs: plain decode {ctl.t_plain or float('nan'):.3f} s, draft "
          f"forward {ctl.t_draft or float('nan'):.3f} s, verification {verify or '-'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
