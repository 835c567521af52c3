"""SmolLM2-135M decode on CPU: the C++ attention / norm / rope / SiLU kernels against the
PyTorch references, in one process with the rounds interleaved (noisy machines: read the
ratio, not the absolute figures).

One engine (``LLMEngine.from_path``, fp32, ``--quant`` as given, prefix caching reset before
every round) generates ``--new-tokens`` greedy tokens after a ``--prompt-tokens`` prompt; the
reference rounds patch ``localchat.kernels.cpu.available`` to False for the data-plane ops
(what ``LOCALCHAT_KERNELS=reference`` does; the quantized matmuls are chosen at load and stay
as loaded). Decode tok/s = (new tokens - 1) / (time of the last token - time of the first).

Usage: ``python scripts/bench_cpu_model.py [--quick] [--rounds N] [--threads N]
[--quant none|auto] [--prompt-tokens N] [--new-tokens N]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _decode_rate(engine, ids, new_tokens: int) -> float:
    from localchat.engine.sampling_params import SamplingParams

    engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    stamps = [time.perf_counter() for _ in engine.generate(ids, params)]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of 64 tokens")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quant", default="none", choices=["none", "auto"])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.new_tokens = 2, 64
    if args.rounds < 1 or args.new_tokens < 2 or args.prompt_tokens < 1:
        ap.error("need --rounds >= 1, --new-tokens >= 2, --prompt-tokens >= 1")

    from localchat.app.settings import cache_dir
    from localchat.engine.config import EngineConfig, QuantConfig
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.llm_engine import LLMEngine
    from localchat.kernels import cpu

    torch.set_num_threads(args.threads)
    if not cpu.available():
        print("bench_cpu_model: error: the C++ CPU kernels are not available", file=sys.stderr)
        return 1
    path = resolve_model("smollm2-135m", cache_dir=cache_dir(), download=True).path
    engine = LLMEngine.from_path(path, EngineConfig(device="cpu", dtype=torch.float32,
                                                    quant=QuantConfig(scheme=args.quant)),
                                 cache_dir=cache_dir())
    text = "The history of the printing press in Europe, told in detail. " * 200
    ids = engine.tokenizer.encode(text)[: args.prompt_tokens]
    print(f"SmolLM2-135M, fp32, quant {args.quant}, {torch.get_num_threads()} threads, "
          f"{len(ids)}-token prompt, {args.new_tokens} greedy tokens, CPU ISA "
          f"{cpu.isa_name()}, {args.rounds} interleaved rounds", flush=True)
    real = cpu.available
    rates: dict[str, list[float]] = {"reference": [], "c++": []}
    _decode_rate(engine, ids, 8)  # warm-up
    for r in range(args.rounds):
        for name in (("reference", "c++") if r % 2 == 0 else ("c++", "reference")):
            cpu.available = (lambda: False) if name == "reference" else real
            try:
                rates[name].append(_decode_rate(engine, ids, args.new_tokens))
            finally:
                cpu.available = real
            print(f"  round {r + 1} {name:9s} {rates[name][-1]:6.1f} tok/s", flush=True)
    ref, new = statistics.median(rates["reference"]), statistics.median(rates["c++"])
    print(f"decode tok/s (median): reference {ref:.1f}, c++ kernels {new:.1f}, "
          f"ratio {new / ref:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
