"""Startup benchmark: what a cached ``localchat ask`` costs before and after its answer.

Usage::

    python scripts/bench_startup.py                        # smollm2-135m, 3 repeats
    python scripts/bench_startup.py --repeats 5 --json startup.json
    python scripts/bench_startup.py --no-serve             # skip the warm-server figure
    python scripts/bench_startup.py --llama-cli PATH       # time llama.cpp's CLI as the peer
    python scripts/bench_startup.py --model qwen2.5-coder-1.5b --no-serve \
        --llama-cli /path/to/llama-completion               # the exact-GGUF issue's target

Whole-process wall times (spawn to exit) and CPU times (user + system: the steadier figure on
a shared machine), min and median over ``--repeats``, all in one run
on the same (shared, noisy) machine, in a temporary ``LOCALCHAT_HOME`` whose cache links to
the real model cache (so every load below is a *cached* load):

- ``python -c "import torch"``: the floor any in-process answer pays;
- ``localchat --help`` and ``localchat ask --help`` (no torch import);
- ``localchat ask --local --quant native --temperature 0 --max-tokens 16 "Hello"``;
- the same ``ask`` through a warm ``localchat serve`` (target <= 0.5 s; no torch import);
- optional peer: llama.cpp's one-shot CLI on the same GGUF, answering the same chat-formatted
  prompt (``llama-completion -m FILE -p Hello -n 16 --jinja --single-turn -c 4096 --temp 0``;
  ``llama-completion`` is the old ``llama-cli``, which became an interactive UI in late 2025),
  so both processes print the same greedy reply (shown beside the table).

Each process's peak RSS (``wait4``) is reported beside its times.

Then a per-phase breakdown of one cached in-process answer (a subprocess timing each step
of ``ask``'s path): imports (torch, the engine), config, tokenizer, weights (the rest of
``LLMEngine.from_path``: model build, mmap'd weights, KV pool), first token, 16 tokens; and
which heavy modules were imported (transformers, torch._dynamo, sympy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROMPT = "Hello"
ASK = ["ask", "--temperature", "0", "--max-tokens", "16", "--no-save", "--no-stdin"]

PHASES = r"""
import json, sys, time
from pathlib import Path
t = {"start": time.perf_counter()}
import torch
t["import_torch"] = time.perf_counter()
from localchat.app.settings import cache_dir
from localchat.engine.config import EngineConfig, QuantConfig
from localchat.engine.hub.resolve import resolve_model
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.loader import load_model_config
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.tokenizer import Tokenizer
t["import_engine"] = time.perf_counter()
source = resolve_model(sys.argv[1], cache_dir=cache_dir(), download=False)
config = load_model_config(Path(source.path), cache_dir())
t["config"] = time.perf_counter()
tok = Tokenizer.from_pretrained(Path(source.path), cache_dir=cache_dir())
ids = tok.apply_chat_template([{"role": "user", "content": "Hello"}])
t["tokenizer"] = time.perf_counter()
engine = LLMEngine.from_source(source, EngineConfig(quant=QuantConfig(scheme="native")),
                               cache_dir=cache_dir())
t["weights"] = time.perf_counter()
outs = engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=16))
next(outs)
t["first_token"] = time.perf_counter()
for _ in outs:
    pass
t["tokens_16"] = time.perf_counter()
heavy = [m for m in ("transformers", "torch._dynamo", "sympy") if m in sys.modules]
names = list(t)
print(json.dumps({"phases_s": {b: t[b] - t[a] for a, b in zip(names, names[1:])},
                  "heavy_modules": heavy}))
"""


def timed(cmd: list[str], env: dict, timeout: float = 900) -> tuple[float, float, int, str]:
    """(wall seconds from spawn to exit, CPU seconds user + system, peak RSS in bytes, the
    last line of stdout) of ``cmd``; raises SystemExit when it fails. On an oversubscribed
    machine the CPU time is the steadier figure: the wall time there mostly measures the
    other processes."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        finally:
            killer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr[-400:]}")
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, \
        (lines[-1] if lines else "")


def repeat(cmd: list[str], env: dict, n: int) -> dict:
    runs = [timed(cmd, env) for _ in range(n)]
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    return {"min": min(walls), "median": statistics.median(walls), "all": walls,
            "cpu_min": min(cpus), "cpu_median": statistics.median(cpus),
            "peak_rss": max(r[2] for r in runs), "reply": runs[-1][3]}


def start_server(cli: list[str], env: dict, model: str) -> subprocess.Popen:
    """``localchat serve`` on a free port; returns once its state file is written."""
    serve = subprocess.Popen([*cli, "serve", "-m", model, "--port", "0", "--quant", "native",
                              "--max-model-len", "2048"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env)
    state = Path(env["LOCALCHAT_HOME"]) / "run" / "server.json"
    deadline = time.monotonic() + 300
    while not state.exists():
        if serve.poll() is not None or time.monotonic() > deadline:
            serve.kill()
            raise SystemExit("the server did not start: " + serve.stderr.read().decode()[-400:])
        time.sleep(0.2)
    return serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-serve", action="store_true", help="skip the warm-server ask")
    parser.add_argument("--llama-cli",
                        default=shutil.which("llama-completion") or shutil.which("llama-cli"),
                        help="llama.cpp's one-shot CLI (llama-completion, or an older "
                             "llama-cli) to time on the same GGUF (default: on PATH)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from localchat.app import settings
    from localchat.engine.hub.resolve import resolve_model

    source = resolve_model(args.model, cache_dir=settings.cache_dir(), download=False)
    home = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    py, cli = sys.executable, [sys.executable, "-m", "localchat.app.cli"]
    ask = [*cli, *ASK, "-m", args.model]
    print(f"workload: {args.model} ({source.path}), cached ask of 16 greedy tokens, "
          f"{args.repeats} repeats; cpu threads {os.cpu_count()}; shared machine (noisy: "
          "compare rows of the same run only)")
    timed([*ask, "--local", "--quant", "native", PROMPT], env)  # warm the page cache, caches
    rows = {
        "import torch": repeat([py, "-c", "import torch"], env, args.repeats),
        "localchat --help": repeat([*cli, "--help"], env, args.repeats),
        "localchat ask --help": repeat([*cli, "ask", "--help"], env, args.repeats),
        "ask (cached, in-process)": repeat([*ask, "--local", "--quant", "native", PROMPT], env,
                                           args.repeats),
    }
    if args.llama_cli:
        rows["llama-cli (same GGUF)"] = repeat(
            [args.llama_cli, "-m", str(source.path), "-p", PROMPT, "-n", "16", "--jinja",
             "--single-turn", "-c", "4096", "-t", str(os.cpu_count() or 1), "--temp", "0"],
            env, args.repeats)
    if not args.no_serve:
        serve = start_server(cli, env, args.model)
        try:
            timed([*ask, PROMPT], env)  # the server's first request warms its caches
            rows["ask (warm server)"] = repeat([*ask, PROMPT], env, args.repeats)
        finally:
            serve.terminate()
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
    probe = subprocess.run([py, "-c", PHASES, args.model], capture_output=True, env=env,
                           timeout=600, check=False)
    if probe.returncode != 0:
        raise SystemExit("phase probe failed: " + probe.stderr.decode()[-400:])
    phases = json.loads(probe.stdout.decode().strip().splitlines()[-1])
    shutil.rmtree(home, ignore_errors=True)

    torch_floor = rows["import torch"]["min"]
    cpu_floor = rows["import torch"]["cpu_min"]
    print(f"\n{'command':28} {'wall min s':>10} {'median':>7} {'- torch':>8} "
          f"{'cpu min s':>10} {'median':>7} {'- torch':>8} {'peak RSS MiB':>13}")
    for name, r in rows.items():
        print(f"{name:28} {r['min']:10.2f} {r['median']:7.2f} {r['min'] - torch_floor:8.2f} "
              f"{r['cpu_min']:10.2f} {r['cpu_median']:7.2f} {r['cpu_min'] - cpu_floor:8.2f} "
              f"{r['peak_rss'] / 2**20:13.0f}")
    for name in ("ask (cached, in-process)", "llama-cli (same GGUF)"):
        if name in rows:
            print(f"  reply of {name}: {rows[name]['reply'][:70]!r}")
    print("\nphases of one cached in-process answer (s):")
    for name, secs in phases["phases_s"].items():
        print(f"  {name:14} {secs:6.2f}")
    print(f"  heavy modules imported: {', '.join(phases['heavy_modules']) or 'none'}")
    result = {"model": args.model, "repeats": args.repeats, "wall_s": rows, **phases}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
