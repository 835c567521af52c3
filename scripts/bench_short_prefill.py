"""Short prompts on CPU: time to the first token for 17-96-token prompts, by prefill path.

Usage::

    python scripts/bench_short_prefill.py                      # the three bundle models
    python scripts/bench_short_prefill.py --models qwen2.5-coder-1.5b --rounds 3 --json out.json
    python scripts/bench_short_prefill.py --after-prefix --layouts panel rows

A chat turn's prompt is usually tens of tokens: more than one decode chunk
(``kernels.CPU_MAX_ROWS`` = 16 rows) and fewer than the prefill GEMM wants. For each model
(``--quant native``, the engine's automatic dtype, ``--threads`` threads) and each prompt
length, ``engine.generate`` of one token on fresh random ids (no prefix-cache hit), wall time,
best of ``--rounds``, three ways in interleaved rounds:

- ``chunks``: the default up to ``kernels.SHORT_PREFILL_MAX_ROWS`` (64) rows: 16-row chunks on
  the exact fp32-activation C++ row kernels (``Linear.forward``) for each layer up to its
  ``LinearMethod.short_prefill_rows`` (int4 and int8 groups 64, bit-plane int5 / int6 layers
  24; more rows on the layer's GEMM);
- ``gemm``: every quantized weight dequantized for ``torch.mm`` (``engine/quant/cpu_prefill.py``,
  what longer prompts take), by setting the chunk bound to 16 rows;
- ``a8 chunks``: the same chunks on the integer-dot kernels (activations rounded to int8 per
  32 columns, as decode rows are), by lifting ``a8_fp32(enabled=False)`` around them. Not
  the default: it moves logits (SmolLM2's first answer to the README's question flips off a
  near-tie), shown here for its speed only.

With ``--llama-peer EXE`` (a binary built from ``scripts/llama_peer.cpp``), llama.cpp on the
same GGUF and the same ids, in the same rounds: its prompt batch's decode time (``prefill_s``,
the prompt alone; ours also counts sampling the token and the engine step around it).

``--after-prefix``: a chat turn's case instead, 1, 4 and 16 new tokens after a 64-token prefix
that the prefix cache holds (each round computes a fresh prefix first, then times the turn),
on the default path. ``--layouts panel rows`` loads the model twice, once with the panel
layouts (the default where they are taken) and once with ``LOCALCHAT_CPU_PANEL=0`` (the row
layouts), and times both in the same rounds.

The chunks row at 80 and 96 tokens (past the bound) is measured with the global bound raised
to the prompt's length (bit-plane layers still stop at 24).
To compare two builds of the kernels, run this script from each checkout in turn (each loads
the kernel build of its own sources) and read the rows of the same path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import torch

LENGTHS = (17, 32, 48, 64, 80, 96)
PATHS = ("chunks", "gemm", "a8 chunks")
TURN_LENGTHS = (1, 4, 16)  # --after-prefix: new tokens after a cached prefix
PREFIX = 64


@contextlib.contextmanager
def prefill_path(path: str, length: int):
    """Within: prompts of ``length`` rows take ``path`` (module switches, restored after)."""
    from localchat import kernels

    bound, a8 = kernels.SHORT_PREFILL_MAX_ROWS, kernels.a8_fp32
    if path == "gemm":
        kernels.SHORT_PREFILL_MAX_ROWS = kernels.CPU_MAX_ROWS
    else:
        kernels.SHORT_PREFILL_MAX_ROWS = max(bound, length)
    if path == "a8 chunks":  # Linear.forward's a8_fp32(enabled=False) keeps the step's a8 mode
        kernels.a8_fp32 = lambda enabled=True: a8(True)
    try:
        yield
    finally:
        kernels.SHORT_PREFILL_MAX_ROWS, kernels.a8_fp32 = bound, a8


def ttft(engine, ids: list[int]) -> float:
    """Seconds from ``generate`` to its one token."""
    from localchat.engine.sampling_params import SamplingParams

    start = time.perf_counter()
    for _ in engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=1)):
        pass
    return time.perf_counter() - start


def load(source, layout: str):
    """The engine of ``source`` with the panel layouts (``panel``, the default) or without
    (``rows``: ``LOCALCHAT_CPU_PANEL=0`` while it loads)."""
    import os

    from localchat.app.settings import cache_dir
    from localchat.engine.config import EngineConfig, QuantConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.quant.int4_panel import PANEL_ENV

    before = os.environ.get(PANEL_ENV)
    if layout == "rows":
        os.environ[PANEL_ENV] = "0"
    try:
        return LLMEngine.from_source(source, EngineConfig(quant=QuantConfig(scheme="native")),
                                     cache_dir=cache_dir())
    finally:
        if before is None:
            os.environ.pop(PANEL_ENV, None)
        else:
            os.environ[PANEL_ENV] = before


def bench_model(name: str, rounds: int, rng: random.Random, threads: int,
                peer_exe: Path | None, layouts: list[str], after_prefix: bool) -> dict:
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    source = resolve_model(name, cache_dir=cache_dir(), download=False)
    engines = {layout: load(source, layout) for layout in layouts}
    peer = None
    if peer_exe is not None and not after_prefix:
        from llama_peers import LlamaPeer  # scripts/, beside this file

        peer = LlamaPeer(peer_exe, Path(source.path), threads)
        peer._run([rng.randrange(1000, 20000) for _ in range(24)], 1)
    for engine in engines.values():
        ttft(engine, [rng.randrange(1000, 20000) for _ in range(24)])  # first-call costs
    paths = ("default",) if after_prefix else PATHS
    rows = [(layout, path) for path in paths for layout in layouts]
    if peer:
        rows.append(("", "llama.cpp"))
    best: dict[tuple[str, str], dict[int, float]] = {row: {} for row in rows}
    try:
        for _ in range(rounds):
            for length in TURN_LENGTHS if after_prefix else LENGTHS:
                for layout, path in rows:
                    ids = [rng.randrange(1000, 20000) for _ in range(length)]
                    if path == "llama.cpp":
                        seconds = peer._run(ids, 1)["prefill_s"]
                    elif after_prefix:
                        prefix = [rng.randrange(1000, 20000) for _ in range(PREFIX)]
                        ttft(engines[layout], prefix)  # now in the prefix cache
                        seconds = ttft(engines[layout], prefix + ids)
                    else:
                        with prefill_path(path, length):
                            seconds = ttft(engines[layout], ids)
                    key = (layout, path)
                    best[key][length] = min(best[key].get(length, seconds), seconds)
    finally:
        if peer is not None:
            peer.close()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+",
                        default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--llama-peer", type=Path, default=None,
                        help="llama.cpp peer: a binary built from scripts/llama_peer.cpp")
    parser.add_argument("--after-prefix", action="store_true",
                        help="1, 4 and 16 new tokens after a cached 64-token prefix")
    parser.add_argument("--layouts", nargs="+", choices=["panel", "rows"], default=["panel"],
                        help="rows: the model loaded with LOCALCHAT_CPU_PANEL=0 too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    results = {}
    lengths = TURN_LENGTHS if args.after_prefix else LENGTHS
    what = (f"new tokens after a cached {PREFIX}-token prefix" if args.after_prefix
            else "prompt lengths")
    print(f"time to first token (s), best of {args.rounds}, {args.threads} threads; "
          f"{what} {', '.join(map(str, lengths))}")
    for name in args.models:
        best = bench_model(name, args.rounds, rng, args.threads, args.llama_peer, args.layouts,
                           args.after_prefix)
        results[name] = {f"{layout} {path}".strip(): {str(n): s for n, s in v.items()}
                         for (layout, path), v in best.items()}
        for (layout, path), v in best.items():
            row = "  ".join(f"{v[n]:6.3f}" for n in lengths)
            print(f"{name:20s} {layout:6s} {path:10s} {row}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
