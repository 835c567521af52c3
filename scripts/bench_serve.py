"""``localchat serve`` benchmark: what a warm server saves ``ask``, and serving under load.

Usage::

    python scripts/bench_serve.py                      # smollm2-135m
    python scripts/bench_serve.py --repeats 3 --json serve.json

Everything runs on 127.0.0.1 in a temporary ``LOCALCHAT_HOME`` (its cache links to the real
model cache), one ``localchat serve --port 0`` subprocess for the whole run.

1. ``ask`` whole-process wall time (spawn to exit) for a 16-token greedy SmolLM2 reply:
   warm (a running server answers) against cold (``--local``: the process loads the model).
   Target: <= 0.5 s warm.
2. ``ask -c`` time to first token on turn 5 of a conversation (``--json`` ``ttft_s``): warm
   (the server holds turns 1-4 in its prefix cache) against cold (``--local``: the whole
   conversation is prefilled by a freshly loaded engine).
3. N concurrent streaming clients (N = 1, 4, 16), 16 greedy tokens per request, different
   prompts: generated tokens/s over the wall time, and client-side TTFT p50 / p99 (time to
   the first content chunk). With few samples p99 is close to the maximum.

Every figure is a ratio or a set measured in the same run on the same (shared, noisy) machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

QUESTION = "Count from one to twenty, in words."
FOLLOW_UPS = ["Now count backwards from five.", "Name three colours.",
              "Name a large animal.", "What is two plus two?"]


def localchat(env: dict, *args: str, timeout: float = 600) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, env=env,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"localchat {' '.join(args)} failed: {proc.stderr.decode()[-400:]}")
    return wall, proc.stdout.decode()


def start_server(env: dict, model: str) -> tuple[subprocess.Popen, str]:
    serve = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "serve", "-m", model,
                              "--port", "0", "--max-model-len", "2048"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env)
    state = Path(env["LOCALCHAT_HOME"]) / "run" / "server.json"
    deadline = time.monotonic() + 300
    while not state.exists():
        if serve.poll() is not None or time.monotonic() > deadline:
            serve.kill()
            raise SystemExit("the server did not start: " + serve.stderr.read().decode()[-400:])
        time.sleep(0.2)
    return serve, json.loads(state.read_text())["url"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


async def load(url: str, clients: int, per_client: int, tokens: int) -> dict:
    ttfts: list[float] = []
    generated = 0

    async def one(c: httpx.AsyncClient, prompt: str) -> None:
        nonlocal generated
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        first = None
        async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    generated += chunk["usage"]["completion_tokens"]
                elif first is None and chunk["choices"] and \
                        chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - start
        ttfts.append(first if first is not None else time.perf_counter() - start)

    async def client(i: int) -> None:
        async with httpx.AsyncClient(timeout=600) as c:
            for j in range(per_client):
                await one(c, f"Write one sentence about the number {i * 100 + j}.")

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), 900)
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": clients * per_client, "tokens": generated,
            "wall_s": wall, "tokens_per_s": generated / wall,
            "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": percentile(ttfts, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3, help="warm ask runs (cold: 1)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from localchat.app import settings

    home = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    print(f"workload: {args.model}, ask of 16 greedy tokens; ask -c turn 5; 1/4/16 streaming "
          f"clients x 16 tokens; cpu threads {os.cpu_count()}; shared machine (noisy)")
    serve, url = start_server(env, args.model)
    results: dict = {"model": args.model}
    try:
        ask = ["ask", "-m", args.model, "--temperature", "0", "--max-tokens", "16", "--no-save"]
        localchat(env, *ask, QUESTION)  # first request: warms the server's caches
        warm = [localchat(env, *ask, QUESTION)[0] for _ in range(args.repeats)]
        cold = localchat(env, *ask, "--local", QUESTION)[0]
        results["ask_wall_s"] = {"warm_median": statistics.median(warm), "warm_all": warm,
                                 "cold": cold, "speedup": cold / statistics.median(warm)}

        conv = ["ask", "-m", args.model, "--temperature", "0", "--max-tokens", "32", "--json"]
        _, out = localchat(env, *conv, QUESTION)
        conv_id = json.loads(out)["conversation_id"]
        for text in FOLLOW_UPS[:3]:
            localchat(env, *conv, "--conversation", conv_id, text)
        turn5 = [*conv, "--conversation", conv_id, "--no-save", FOLLOW_UPS[3]]
        warm5 = json.loads(localchat(env, *turn5)[1])
        cold5 = json.loads(localchat(env, *turn5, "--local")[1])
        results["turn5_ttft_s"] = {
            "warm": warm5["timings"]["ttft_s"], "cold": cold5["timings"]["ttft_s"],
            "prompt_tokens": warm5["usage"]["prompt_tokens"],
            "warm_cached_tokens": warm5["usage"]["cached_tokens"],
            "speedup": cold5["timings"]["ttft_s"] / warm5["timings"]["ttft_s"]}

        results["load"] = [asyncio.run(load(url, n, per, 16))
                           for n, per in ((1, 4), (4, 2), (16, 1))]
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()

    a, t = results["ask_wall_s"], results["turn5_ttft_s"]
    print(f"\nask wall time: warm {a['warm_median']:.2f} s (median of {args.repeats}), "
          f"cold --local {a['cold']:.2f} s, {a['speedup']:.1f}x")
    print(f"ask -c turn 5 TTFT: warm {t['warm']:.3f} s ({t['warm_cached_tokens']} of "
          f"{t['prompt_tokens']} prompt tokens cached), cold {t['cold']:.3f} s, "
          f"{t['speedup']:.1f}x")
    print("\n| clients | requests | tokens | tokens/s | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|")
    for row in results["load"]:
        print(f"| {row['clients']} | {row['requests']} | {row['tokens']} | "
              f"{row['tokens_per_s']:.1f} | {row['ttft_p50_s']:.3f} | {row['ttft_p99_s']:.3f} |")
    print(json.dumps(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
