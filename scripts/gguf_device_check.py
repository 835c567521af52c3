"""A real GGUF end to end on another device, compared with this machine's answers.

``gpu_check.sh`` runs random weights; this runs the path a GPU user's first ``localchat ask``
takes: a GGUF file (a bundle model cut to a few blocks by ``scripts/gguf_truncate.py`` so it
fits the device tool), its native repack, the weight cache, the tokenizer and chat template,
the CLI. Its first run on an H200 found two defects that failed every ``ask`` of a GGUF on a
GPU (the first load, then every cached one).

``record`` (here, on the CPU) and ``check`` (there) run the same work and write JSON:
- per weight format (native, none, int8, int4), through ``LLMEngine`` with bf16 activations:
  the greedy ids of 24 tokens (EOS ignored) and the argmax of each row's logits over a fixed
  77-token sequence in one prefill (teacher-forced);
- the CLI: ``localchat ask`` three times in a new home (the first load, a cached one, and
  ``--draft ngram``), greedy, its stdout.
``check`` prints, per row, whether the greedy ids equal the reference's, how many leading ids
do, and the teacher-forced agreement; bf16 on two devices rounds differently, so a late
difference on a truncated model's near-ties is expected, an early one or a low agreement is
not. Exits 1 when a load, a generation or a CLI call fails (the defects it exists to find).

Usage::

    python scripts/gguf_truncate.py ~/.cache/localchat/models/smollm2-135m/*.gguf small.gguf
    python scripts/gguf_device_check.py record small.gguf ref.json
    # on the device, with the repository, small.gguf and ref.json carried:
    python scripts/gguf_device_check.py check small.gguf ref.json --device cuda --out res.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

PROMPT = "What is the capital of France? Say the capital of France."
FORMATS = ("native", "none", "int8", "int4")
CLI_RUNS = {"first": [], "cached": [], "ngram": ["--draft", "ngram"]}
NEW_TOKENS = 24


def engine_rows(gguf: Path, device: str, cache: Path) -> dict:
    """Greedy ids and teacher-forced argmaxes per weight format (``{"error": ...}`` on a
    failure, which is the finding)."""
    import torch

    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams
    from localchat.engine.step_inputs import BatchEntry, build_batch

    rows = {}
    for fmt in FORMATS:
        try:
            t0 = time.perf_counter()
            engine = LLMEngine.from_path(gguf, EngineConfig(
                device=device, dtype=torch.bfloat16, quant=QuantConfig(scheme=fmt),
                scheduler=SchedulerConfig(max_model_len=512)), cache_dir=cache)
            load_s = time.perf_counter() - t0
            ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
            greedy: list[int] = []
            for out in engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS,
                                                           ignore_eos=True)):
                greedy += list(out.new_token_ids)
            seq = ids + [(i * 7919) % 40000 + 100 for i in range(77 - len(ids))]
            bs = engine.config.cache.block_size
            blocks = list(range(1, 1 + (len(seq) + bs - 1) // bs))
            with torch.inference_mode():
                inp, pos, meta, sel = build_batch([BatchEntry(blocks, 0, seq, "all")], bs,
                                                  torch.device(device))
                model = engine.runner.model
                logits = model.compute_logits(model(inp, pos, engine.runner.kv_caches,
                                                    meta)[sel[0]])
            rows[fmt] = {"load_s": round(load_s, 2), "greedy": greedy,
                         "argmax": logits.argmax(-1).tolist()}
            del engine
        except Exception:  # noqa: BLE001 - a failure is what this check reports
            rows[fmt] = {"error": traceback.format_exc()[-1200:]}
        print(f"  {fmt:6s} {'ERROR' if 'error' in rows[fmt] else 'ok'}", flush=True)
    return rows


def cli_rows(gguf: Path) -> dict:
    """``localchat ask`` in a new home: exit code, stdout and the last stderr lines."""
    rows = {}
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, LOCALCHAT_HOME=home, XDG_CONFIG_HOME=home, XDG_DATA_HOME=home)
        for name, extra in CLI_RUNS.items():
            cmd = [sys.executable, "-m", "localchat.app.cli", "ask", "--model", str(gguf),
                   "--temperature", "0", "--max-tokens", str(NEW_TOKENS), "--no-save", *extra,
                   PROMPT]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                                 check=False)
            rows[name] = {"rc": out.returncode, "stdout": out.stdout,
                          "stderr": out.stderr.strip().splitlines()[-3:]}
            print(f"  ask {name:6s} rc={out.returncode}", flush=True)
    return rows


def run(gguf: Path, device: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        return {"device": device, "engine": engine_rows(gguf, device, Path(cache)),
                "cli": cli_rows(gguf)}


def compare(got: dict, ref: dict) -> tuple[list[str], bool]:
    """Markdown lines comparing ``got`` with ``ref``, and whether anything failed."""
    failed = False
    lines = [(f"| {got['device']} vs {ref['device']} | greedy equal | leading ids equal "
              "| teacher-forced argmax agreement | load s |"), "|---|---|---|---|---|"]
    for fmt, row in got["engine"].items():
        want = ref["engine"].get(fmt, {})
        if "error" in row or "error" in want:
            failed |= "error" in row
            lines.append(f"| {fmt} | error: {row.get('error', want.get('error', ''))[-120:]!r} "
                         "| | | |")
            continue
        lead = next((i for i, (a, b) in enumerate(zip(row["greedy"], want["greedy"]))
                     if a != b), min(len(row["greedy"]), len(want["greedy"])))
        agree = sum(a == b for a, b in zip(row["argmax"], want["argmax"]))
        lines.append(f"| {fmt} | {row['greedy'] == want['greedy']} | {lead} of "
                     f"{len(want['greedy'])} | {agree} of {len(want['argmax'])} | "
                     f"{row['load_s']} |")
    lines += ["", "| ask | exit code | stdout equal to the reference's |", "|---|---|---|"]
    for name, row in got["cli"].items():
        failed |= row["rc"] != 0
        same = row["stdout"] == ref["cli"].get(name, {}).get("stdout")
        note = "" if row["rc"] == 0 else f" ({' / '.join(row['stderr'])[-160:]})"
        lines.append(f"| {name} | {row['rc']}{note} | {same} |")
    return lines, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("ref", type=Path, help="reference JSON (written by record, read by check)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, help="check: this run's JSON")
    args = ap.parse_args(argv)
    if args.mode == "check" and not args.ref.is_file():
        print(f"gguf_device_check: error: no reference {args.ref} (run record first)",
              file=sys.stderr)
        return 2
    result = run(args.gguf, args.device)
    if args.mode == "record":
        args.ref.write_text(json.dumps(result))
        return 0
    if args.out:
        args.out.write_text(json.dumps(result))
    lines, failed = compare(result, json.loads(args.ref.read_text()))
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
