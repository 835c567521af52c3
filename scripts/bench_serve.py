"""``localchat serve`` benchmark: what a warm server saves ``ask``, and serving under load.

Usage::

    python scripts/bench_serve.py                      # smollm2-135m
    python scripts/bench_serve.py --repeats 3 --json serve.json
    python scripts/bench_serve.py --ask-only --repeats 7 --compare-checkout /tmp/old

Everything runs on 127.0.0.1 in a temporary ``LOCALCHAT_HOME`` (its cache links to the real
model cache), one ``localchat serve --port 0`` subprocess for the whole run.

1. ``ask`` whole-process wall time (spawn to exit) for a 16-token greedy SmolLM2 reply:
   warm (a running server answers) against cold (``--local``: the process loads the model).
   Target: <= 0.5 s warm. Each warm run is an ``ask --json``, whose client-side timings give
   the server's share (request sent to last chunk: ``ttft_s + (tokens - 1) / decode tok/s``)
   and so the client's own (the rest: interpreter start, imports, parsing, state file,
   ``/health``, history); a bare ``python -c pass`` is timed beside it as the floor of any
   process. ``--compare-checkout DIR`` times the warm ``ask`` of another checkout of
   localchat (e.g. ``git worktree add /tmp/old <commit>``) interleaved with this one, against
   the same server (its ``app/``, ``engine/``, ... are put first on ``PYTHONPATH``).
2. ``ask -c`` time to first token on turn 5 of a conversation (``--json`` ``ttft_s``): warm
   (the server holds turns 1-4 in its prefix cache) against cold (``--local``: the whole
   conversation is prefilled by a freshly loaded engine).
3. N concurrent streaming clients (N = 1, 4, 16; ``--clients``), 16 greedy tokens per request
   (``--load-tokens``), different prompts: generated tokens/s over the wall time, its ratio to
   one client's, and client-side TTFT p50 / p99 (time to the first content chunk). With few
   samples p99 is close to the maximum. Each client sends ``--requests-per-client`` requests
   one after another (default: 4 at N = 1, 2 at N = 4, else 1). ``--load-only`` skips 1 and 2
   (e.g. ``--load-only --clients 1 8 --load-tokens 128``: continuous batching's throughput at
   8 concurrent decode-heavy requests against one stream's, the CPU-kernels issue's target).

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


def python_floor(env: dict) -> float:
    """Wall seconds of ``python -c pass`` in ``env``: the floor of any Python process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def warm_ask(env: dict, ask: list[str]) -> dict:
    """One warm ``ask --json``: its wall time, the server's share of it (request sent to
    the last chunk, from the client-side timings) and the client's own (the rest)."""
    wall, out = localchat(env, *ask, "--json", QUESTION)
    doc = json.loads(out)
    ttft, tps = doc["timings"]["ttft_s"], doc["timings"]["decode_tokens_per_s"]
    tokens = doc["usage"]["completion_tokens"]
    stream = ttft + ((tokens - 1) / tps if tps and tokens > 1 else 0.0)
    return {"wall_s": wall, "server_s": stream, "client_s": wall - stream}


def checkout_env(env: dict, checkout: Path, home: Path) -> dict:
    """``env`` with another localchat checkout first on ``PYTHONPATH`` (a ``localchat``
    package of links to its ``app/``, ``engine/``, ``kernels/``, ``themes/``)."""
    package = home / "compare" / "localchat"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("app", "engine", "kernels", "themes"):
        if (checkout / name).is_dir():
            (package / name).symlink_to(checkout.resolve() / name, target_is_directory=True)
    return {**env, "PYTHONPATH": str(package.parent)}


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


class _Done(Exception):
    """``--ask-only``: the ask figures are in."""


class _LoadOnly(Exception):
    """On to the load rounds (after the ask figures, or at once with ``--load-only``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3, help="warm ask runs (cold: 1)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--ask-only", action="store_true",
                        help="only the warm / cold ask times (no turn 5, no load)")
    parser.add_argument("--compare-checkout", type=Path, default=None,
                        help="another localchat checkout whose warm ask is timed too")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16],
                        help="concurrent streaming clients per load round")
    parser.add_argument("--load-tokens", type=int, default=16,
                        help="greedy tokens per request in the load rounds")
    parser.add_argument("--requests-per-client", type=int, default=None)
    parser.add_argument("--load-only", action="store_true", help="only the load rounds")
    args = parser.parse_args()

    from localchat.app import settings

    home = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    print(f"workload: {args.model}, ask of 16 greedy tokens; ask -c turn 5; "
          f"{'/'.join(map(str, args.clients))} streaming clients x {args.load_tokens} tokens; "
          f"cpu threads {os.cpu_count()}; shared machine (noisy)")
    serve, url = start_server(env, args.model)
    results: dict = {"model": args.model}
    try:
        if args.load_only:
            raise _LoadOnly
        ask = ["ask", "-m", args.model, "--temperature", "0", "--max-tokens", "16", "--no-save"]
        other = checkout_env(env, args.compare_checkout, home) if args.compare_checkout \
            else None
        localchat(env, *ask, QUESTION)  # first request: warms the server's caches
        warm, compared, floor = [], [], []
        for _ in range(args.repeats):  # interleaved: the same load for each
            floor.append(python_floor(env))
            warm.append(warm_ask(env, ask))
            if other is not None:
                compared.append(warm_ask(other, ask))
        cold = localchat(env, *ask, "--local", QUESTION)[0]
        med = {key: statistics.median(r[key] for r in warm)
               for key in ("wall_s", "server_s", "client_s")}
        results["ask_wall_s"] = {"warm_median": med["wall_s"], "warm_all": warm,
                                 "warm_server_median": med["server_s"],
                                 "warm_client_median": med["client_s"],
                                 "python_floor_median": statistics.median(floor),
                                 "cold": cold, "speedup": cold / med["wall_s"]}
        if compared:
            results["ask_wall_s"]["compared"] = {
                "checkout": str(args.compare_checkout), "runs": compared,
                **{f"{key}_median": statistics.median(r[key] for r in compared)
                   for key in ("wall_s", "server_s", "client_s")}}
        if args.ask_only:
            raise _Done

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

        raise _LoadOnly
    except _LoadOnly:
        asyncio.run(load(url, 1, 1, 4))  # warm the server's kernels and caches
        results["load"] = [
            asyncio.run(load(url, n, args.requests_per_client or {1: 4, 4: 2}.get(n, 1),
                             args.load_tokens))
            for n in args.clients]
    except _Done:
        pass
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()

    if not args.load_only:
        _print_ask(results, args)
    if not args.ask_only:
        _print_load(results)
    print(json.dumps(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _print_load(results: dict) -> None:
    """The load rounds' table, throughput against one client's."""
    print("\n| clients | requests | tokens | tokens/s | vs 1 client | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|---|")
    one = next((r["tokens_per_s"] for r in results["load"] if r["clients"] == 1), None)
    for row in results["load"]:
        ratio = f"{row['tokens_per_s'] / one:.2f}x" if one else "-"
        print(f"| {row['clients']} | {row['requests']} | {row['tokens']} | "
              f"{row['tokens_per_s']:.1f} | {ratio} | {row['ttft_p50_s']:.3f} | "
              f"{row['ttft_p99_s']:.3f} |")


def _print_ask(results: dict, args: argparse.Namespace) -> None:
    """The warm / cold ``ask`` and turn-5 figures."""
    a = results["ask_wall_s"]
    print(f"\nask wall time: warm {a['warm_median']:.2f} s (median of {args.repeats}; "
          f"server {a['warm_server_median']:.2f} s, client {a['warm_client_median']:.2f} s; "
          f"python -c pass {a['python_floor_median']:.2f} s), cold --local {a['cold']:.2f} s, "
          f"{a['speedup']:.1f}x; target <= 0.5 s warm: "
          f"{'met' if a['warm_median'] <= 0.5 else 'not met'}")
    if "compared" in a:
        c = a["compared"]
        print(f"  {c['checkout']}: warm {c['wall_s_median']:.2f} s (server "
              f"{c['server_s_median']:.2f} s, client {c['client_s_median']:.2f} s); this "
              f"checkout / that: wall {a['warm_median'] / c['wall_s_median']:.2f}, client "
              f"{a['warm_client_median'] / c['client_s_median']:.2f}")
    if args.ask_only:
        return
    t = results["turn5_ttft_s"]
    print(f"ask -c turn 5 TTFT: warm {t['warm']:.3f} s ({t['warm_cached_tokens']} of "
          f"{t['prompt_tokens']} prompt tokens cached), cold {t['cold']:.3f} s, "
          f"{t['speedup']:.1f}x")


if __name__ == "__main__":
    main()
