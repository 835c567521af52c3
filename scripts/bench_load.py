"""Load benchmark: cold and cached loads, whole-process ``ask``, peak RSS, held bytes.

Usage::

    python scripts/bench_load.py                           # smollm2-135m: native, none, int4
    python scripts/bench_load.py --formats native none --agreement --json out.json

For each weight format (``--quant`` values), each measurement in a fresh subprocess:

* cold load s: ``LLMEngine.from_path`` with an empty quantized-weight cache (the GGUF's
  converted metadata already cached; the file in the page cache), so it includes repacking
  (native) or quantizing (int8/int4); the cache entry is written by a background thread, as
  the CLI writes it (``QuantConfig.background_write``), and "written s" is when that write
  had finished (from the same start; the process waits for it at exit).
* cached load s: the same again, now reading the cache entry.
* ask s: wall time of the whole ``localchat ask --quant F --max-tokens 16`` process
  (imports, tokenizer, load from cache, prefill, 16 tokens, exit), greedy.
* peak RSS: ``VmHWM`` of the cached-load process after one greedy token (weights + KV pool +
  runtime; the token makes a forward read every weight, so a memory-mapped cache's pages count).
* held MB: bytes of the loaded model's tensors (parameters and buffers, RoPE table excluded)
  against the GGUF's tensor bytes (the file's tensor data).
* top-1 (``--agreement``): agreement with transformers' model loaded from the same GGUF (fp32
  oracle) over 256 teacher-forced positions of a fixed text, with fp32 activations (the
  table's column); a line after the table adds each format with bf16 activations (the CPU
  default: one prefill, and 16-token forwards through the decode kernels) and, with
  ``--llama-peer``, llama.cpp's own agreement on the same ids.
* ask --keep-alive row (``--keep-alive``): the first ``localchat ask --keep-alive 2m`` (it
  starts a server, default weight format) and the median of three more, each a new question of
  the same shape, answered by that server; the server is stopped afterwards.
* llama.cpp peer row (``--llama-cli EXE``: llama.cpp's ``llama-completion`` / ``llama-cli``,
  run as ``--jinja --single-turn -p PROMPT -n 16 --temp 0 -c 4096``, the file's chat template
  applied as ``ask`` applies it; or ``--llama-peer EXE``: a binary built from
  ``scripts/llama_peer.cpp``, whose ``ask`` mode applies the chat template): the same file,
  threads and question, whole-process wall time, peak RSS (``ru_maxrss`` of the child) and its
  own load time, run twice (first and second run; llama.cpp keeps no cache of its own, the
  GGUF is in the page cache both times).

Figures on the shared 2-core development machine are noisy (other jobs run beside it): read
them as ratios against the ``none`` row measured in the same run, not as absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LOAD = r"""
import json, sys, time, torch
from pathlib import Path
t0 = time.perf_counter()
from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
torch.set_num_threads(int(sys.argv[4]))
cfg = EngineConfig(device="cpu", quant=QuantConfig(scheme=sys.argv[3], background_write=True),
                   scheduler=SchedulerConfig(max_model_len=4096, max_num_seqs=1))
t1 = time.perf_counter()
engine = LLMEngine.from_path(Path(sys.argv[1]), cfg, cache_dir=Path(sys.argv[2]))
t2 = time.perf_counter()
model = engine.runner.model
held = sum(t.nbytes for n, t in list(model.named_parameters()) + list(model.named_buffers())
           if not n.endswith("cos_sin_cache"))
held += sum(m.weight_t.nbytes for m in model.modules() if getattr(m, "weight_t", None) is not None)
# one greedy token first: a mapped cache's pages count in RSS only once a forward reads them
from localchat.engine.sampling_params import SamplingParams
ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
for _ in engine.generate(ids, SamplingParams(temperature=0, max_tokens=1)):
    pass
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
from localchat.engine.quant.cache import wait_saved
wait_saved()  # the background cache write, if this load started one
t3 = time.perf_counter()
print(json.dumps(dict(load_s=t2 - t1, written_s=t3 - t1, held=held,
                      scheme=engine.config.quant.scheme,
                      peak=int(status["VmHWM"].split()[0]) * 1024)))
"""


def _run_load(gguf: Path, cache: Path, fmt: str, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _LOAD, str(gguf), str(cache), fmt, str(threads)],
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise SystemExit(f"load {fmt} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_ask(model: str, fmt: str, threads: int) -> float:
    """Wall time (s) of one whole ``localchat ask`` process, its torch threads set to
    ``threads`` through ``OMP_NUM_THREADS`` (ask has no thread option)."""
    exe = Path(sys.executable).with_name("localchat")
    cmd = [str(exe), "ask", "--model", model, "--quant", fmt, "--max-tokens", "16",
           "--temperature", "0", "What is the capital of France?"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"ask {fmt} failed:\n{out.stderr[-2000:]}")
    return wall


QUESTION = "What is the capital of France?"
# The warm-server asks: same length and template, another country each, so a server's prefix
# cache holds only what every question shares (the chat template's system part).
WARM_QUESTIONS = ("What is the capital of Spain?", "What is the capital of Italy?",
                  "What is the capital of Japan?")


def _keep_alive_row(model: str, threads: int) -> dict:
    """``ask --keep-alive``: the first ask starts a server (its whole-process time), the
    next ones answer through it (the median of :data:`WARM_QUESTIONS`); the server this
    started is stopped afterwards. Default weight format (``auto``: native on a GGUF)."""
    import signal
    import statistics

    from localchat.app.server.state import read_state

    exe = Path(sys.executable).with_name("localchat")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before = read_state()

    def ask(question: str) -> float:
        cmd = [str(exe), "ask", "--model", model, "--keep-alive", "2m", "--max-tokens", "16",
               "--temperature", "0", "--no-save", question]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False,
                             env=env, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise SystemExit(f"ask --keep-alive failed:\n{out.stderr[-2000:]}")
        return time.perf_counter() - t0

    try:
        first = ask(QUESTION)
        warm = [ask(q) for q in WARM_QUESTIONS]
    finally:
        info = read_state()
        if info is not None and info.pid and (before is None or before.pid != info.pid):
            os.kill(info.pid, signal.SIGTERM)
    return {"format": "ask --keep-alive", "loaded_as": "warm server", "cold_load_s": None,
            "cached_load_s": None, "ask_s": statistics.median(warm), "ask_first_s": first,
            "peak_rss": None, "held": None, "warm_asks_s": warm}


def _run_llama(cmd: list[str]) -> dict:
    """Run one llama.cpp process: its wall time (s), peak RSS (bytes, ``ru_maxrss`` of that
    child through ``wait4``), own load time (s) and the reply's tail."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{stderr[-2000:]}")
    load = None
    m = re.search(r"load time\s*=\s*([\d.]+) ms", stderr)  # llama_perf_context_print
    if m:
        load = float(m.group(1)) / 1e3
    else:  # llama_peer ask: a JSON line last on stderr
        for line in reversed(stderr.strip().splitlines()):
            if line.startswith("{"):
                load = json.loads(line).get("load_s")
                break
    return {"wall": wall, "load": load, "peak": usage.ru_maxrss * 1024,
            "reply": stdout.strip()[-200:]}


def _llama_row(args, gguf: Path, tensor_bytes: int) -> dict:
    """The llama.cpp peer's row: two runs of its CLI on ``gguf`` (first, then second)."""
    if args.llama_peer is not None:
        cmd = [str(args.llama_peer), "ask", str(gguf), str(args.threads), "4096", "16", QUESTION]
    else:
        cmd = [str(args.llama_cli), "-m", str(gguf), "-t", str(args.threads), "-c", "4096",
               "-n", "16", "--temp", "0", "--jinja", "--single-turn", "-p", QUESTION]
    first, second = _run_llama(cmd), _run_llama(cmd)
    return {"format": "llama.cpp", "loaded_as": "GGUF as stored", "cold_load_s": first["load"],
            "cached_load_s": second["load"], "ask_s": second["wall"], "ask_first_s": first["wall"],
            "peak_rss": max(first["peak"], second["peak"]), "held": None,
            "gguf_tensor_bytes": tensor_bytes, "reply": second["reply"]}


def _gguf_tensor_bytes(gguf: Path) -> int:
    from localchat.engine.loader.gguf import _tensor_index

    return sum(t["n_bytes"] for t in _tensor_index(gguf, None)["tensors"])


def _agreement(gguf: Path, formats: list[str], cache: Path, peer: Path | None = None,
               threads: int = 2) -> dict[str, float]:
    """Top-1 agreement with the fp32 oracle over 256 teacher-forced positions: per format
    with fp32 activations (``fmt``), and with the CPU's default bf16 activations through one
    prefill (``fmt@bf16``) and through successive 16-token forwards, the decode /
    verification kernels (``fmt@bf16/16``); ``llama.cpp`` for the peer binary's ``top1``
    mode (its own activation quantization) on the same ids."""
    import torch
    from transformers import AutoModelForCausalLM

    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model, load_model_config
    from localchat.engine.quant.evaluate import EVAL_TEXT, teacher_forced_logits, top1_agreement
    from localchat.engine.tokenizer import Tokenizer

    config = load_model_config(gguf, cache)
    ids = Tokenizer.from_pretrained(gguf, cache_dir=cache).encode(EVAL_TEXT)[:257]
    oracle = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        want = oracle(torch.tensor([ids])).logits[0].float()
    del oracle
    out = {}
    for fmt in formats:
        for dtype, tag in ((torch.float32, ""), (torch.bfloat16, "@bf16")):
            model = load_model(gguf, config, dtype=dtype, device=torch.device("cpu"),
                               max_position=512, cache_dir=cache,
                               quant=QuantConfig(scheme=fmt))
            with torch.no_grad():
                out[fmt + tag] = top1_agreement(teacher_forced_logits(model, ids)[:256],
                                                want[:256])
                if tag:
                    out[fmt + tag + "/16"] = top1_agreement(
                        teacher_forced_logits(model, ids, chunk=16)[:256], want[:256])
            del model
    if peer is not None:
        proc = subprocess.run([str(peer), "top1", str(gguf), str(threads),
                               ",".join(map(str, ids))], capture_output=True, text=True,
                              check=False)
        if proc.returncode == 0:
            got = torch.tensor([int(v) for v in proc.stdout.split(",")][:256])
            out["llama.cpp"] = (got == want[:256].argmax(-1)).float().mean().item()
        else:
            print(f"llama.cpp top1 failed: {proc.stderr.strip()[:200]}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--formats", nargs="+", default=["native", "none", "int4"])
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--agreement", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep-alive", action="store_true",
                        help="add a row: ask through the server ask --keep-alive starts "
                        "(first ask, then the median of 3 warm asks)")
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--llama-cli", type=Path, metavar="EXE",
                      help="llama.cpp peer row: llama.cpp's llama-completion (or llama-cli)")
    peer.add_argument("--llama-peer", type=Path, metavar="EXE",
                      help="llama.cpp peer row: a binary built from scripts/llama_peer.cpp")
    args = parser.parse_args(argv)
    exe = args.llama_cli or args.llama_peer
    if exe is not None and not os.access(exe, os.X_OK):
        parser.error(f"{exe} is not an executable file")

    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    gguf = resolve_model(args.model, cache_dir=cache_dir()).path
    tensor_bytes = _gguf_tensor_bytes(gguf)
    rows = []
    for fmt in args.formats:
        with tempfile.TemporaryDirectory() as tmp:
            cold = _run_load(gguf, Path(tmp), fmt, args.threads)  # empty weight cache
            cached = _run_load(gguf, Path(tmp), fmt, args.threads)
        _run_load(gguf, cache_dir(), fmt, args.threads)  # fill the user cache for ask
        rows.append({"format": fmt, "loaded_as": cached["scheme"], "cold_load_s": cold["load_s"],
                     "cold_written_s": cold["written_s"], "cached_load_s": cached["load_s"],
                     "ask_s": _run_ask(args.model, fmt, args.threads),
                     "peak_rss": cached["peak"], "held": cached["held"],
                     "gguf_tensor_bytes": tensor_bytes})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress
    if args.agreement:
        agree = _agreement(gguf, [r["loaded_as"] for r in rows], cache_dir(), args.llama_peer,
                           args.threads)
        for r in rows:
            r["top1"] = agree[r["loaded_as"]]
    if args.keep_alive:
        rows.append(_keep_alive_row(args.model, args.threads))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if exe is not None:
        rows.append(_llama_row(args, gguf, tensor_bytes))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{args.model} ({gguf.name}), {args.threads} threads; GGUF tensor bytes "
          f"{tensor_bytes / 1e6:.1f} MB")
    print("| --quant | loads as | cold load s (written s) | cached load s | ask s (16 tokens) "
          "| peak RSS | held MB (x GGUF) | top-1 |")
    print("|---|---|---|---|---|---|---|---|")
    def num(v):
        return "-" if v is None else f"{v:.2f}"

    def written(r):
        return f" ({r['cold_written_s']:.2f})" if r.get("cold_written_s") else ""

    def rss(v):
        return "-" if v is None else f"{v / 2**30:.2f} GiB"

    for r in rows:
        top1 = f"{100 * r['top1']:.1f}%" if "top1" in r else "-"
        held = "-" if r["held"] is None else \
            f"{r['held'] / 1e6:.0f} ({r['held'] / tensor_bytes:.2f}x)"
        print(f"| {r['format']} | {r['loaded_as']} | {num(r['cold_load_s'])}{written(r)} | "
              f"{num(r['cached_load_s'])} | {r['ask_s']:.2f} | {rss(r['peak_rss'])} | "
              f"{held} | {top1} |")
    if args.keep_alive:
        r = next(r for r in rows if r["format"] == "ask --keep-alive")
        print(f"ask --keep-alive row: median of {len(r['warm_asks_s'])} asks answered by the "
              f"server the first ask started ({r['ask_first_s']:.2f} s, load included); "
              "the ask processes only, not the server's memory")
    if exe is not None:
        print("llama.cpp row: its CLI's whole process on the same file and threads, 16 tokens; "
              "cold/cached load = its own load time on the first/second run (no cache of its "
              "own; the file in the page cache both times)")
    if args.agreement:
        print("top-1 agreement with the fp32 oracle, 256 positions: "
              + ", ".join(f"{k} {100 * v:.1f}%" for k, v in agree.items())
              + " (@bf16: bf16 activations, one prefill; /16: 16-token forwards, the decode "
                "kernels; llama.cpp: --llama-peer's top1 mode)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "agreement": agree} if args.agreement
                                        else rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
