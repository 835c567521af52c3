#!/usr/bin/env bash
# One prepared GPU check (stage limits 9 minutes in all on an H200, inside the device tool's
# 10-minute command; stage 3 also gets the time the earlier stages did not use; needs no download, no install: torch + Triton (+ transformers for one row,
# skipped with a line when missing); textual, gguf and platformdirs stay out of its import path):
#   0. scripts/gpu_stage0.py: versions, SM count, L2 size, and a batch-1 eager decode step
#      under torch.cuda.set_sync_debug_mode("error") (stage0.json);
#   1. the tests natively on the GPU: tests/kernels, the CUDA-path tests
#      (tests/engine/test_cuda_graphs.py, test_cuda_defects.py) and the quant maths (fp8 with
#      real _scaled_mm) (tests.txt);
#   2a. scripts/bench_kernels.py --quick: copy bandwidth and the other ops, eager, each checked
#      against its reference before timing (kernels.json);
#   2b. scripts/gpu_kernels_graph.py: the linears at real Llama-3.1-8B shapes (qkv, o, gate_up,
#      down, LM head; M = 1, 16) as F.linear bf16, fp8 _scaled_mm, int8 and int4, and decode
#      attention at 4k context (GQA 32/8, d 128; batch 1, 16) beside SDPA on contiguous KV,
#      each checked against its reference, then timed inside a CUDA graph with the weight / KV
#      buffers rotated past 2 x L2 (kgraph.json);
#   3. scripts/gpu_engine_e2e.py: end to end through LLMEngine on random Llama-3.1-8B weights
#      (32 layers), an offline tokenizer, KV sized by plan_cuda_pools from mem_get_info: bf16 /
#      fp8 / int8 / int4 decode tok/s at batch 1 and 16 as % of the copy bandwidth, ms per step
#      outside the forward, prefix-cached TTFT, speculative verify cost, and transformers'
#      generate on the same weights at batch 1 (engine.json, rewritten after every row);
#   4. a Markdown summary (gpu_check.md, gpu_check.json).
# (scripts/gpu_bench_e2e.py, the model-runner-level decode without the engine, is no longer a
# stage: run it alone.) Each stage writes its results as soon as it ends, so a run cut short
# keeps what it finished. Writes to the directory given as $1, else $OUT, else ./gpu_check_out:
# eight files at most (gpu_check.log/.md/.json, tests.txt, stage0.json, kernels.json,
# kgraph.json, engine.json: the device tool brings back eight); each stage's Markdown part stays
# in a scratch folder and is folded into gpu_check.md. The C++ CPU kernels are not built (CXX
# points nowhere): the CPU side of every comparison runs the PyTorch references, and the
# CPU-kernel tests are not in stage 1 (they would compile for minutes and need platformdirs).
# Exits 1 when a stage failed.
# GPU_CHECK_DRY_RUN=1 runs tiny versions of the stages on a CPU (to check the script itself);
# GPU_CHECK_ENGINE_ARGS adds arguments to stage 3 (gpu_engine_e2e.py --help).
# Usage: bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOG="$OUT_DIR/gpu_check.log"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
PARTS="$(mktemp -d)"  # each stage's own outputs (json + md); the json is copied to OUT_DIR
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
# No C++ CPU kernels here: nothing to compile, no platformdirs needed for their build folder.
export CXX=/nonexistent/c++

DEVICE=cuda
TESTS=(tests/kernels/test_triton_*.py tests/kernels/test_quant_matmul.py
       tests/kernels/test_reference.py tests/engine/test_cuda_graphs.py
       tests/engine/test_cuda_defects.py)
for t in tests/engine/quant/test_quant_maths.py tests/engine/test_quant_maths.py; do
    [ -f "$t" ] && TESTS+=("$t") && break
done
STAGE0_ARGS=()
KERNEL_ARGS=(--quick)
KGRAPH_ARGS=()
# Extra stage-3 arguments for a rerun inside the budget, e.g. "--schemes bf16,int4 --no-hf".
read -r -a ENGINE_ARGS <<< "${GPU_CHECK_ENGINE_ARGS:-}"
if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
    # Check this script's plumbing on a CPU: tiny sizes, a few tests, no GPU figures.
    DEVICE=cpu
    TESTS=(tests/kernels/test_quant_matmul.py)
    STAGE0_ARGS=(--tiny)
    KERNEL_ARGS=(--quick)
    KGRAPH_ARGS=(--tiny --calls 8)
    ENGINE_ARGS+=(--tiny --steps 4 --context 48 --batch-sizes 1,4 --max-model-len 256)
elif ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: error: no CUDA device visible to $PY" >&2
    exit 1
fi
# localchat importable without installing it: a namespace-package shim over the repo folders.
if ! "$PY" -c "import localchat.kernels, localchat.engine" 2>/dev/null; then
    SHIM="$(mktemp -d)"
    mkdir -p "$SHIM/localchat"
    for sub in app engine kernels themes; do ln -s "$PWD/$sub" "$SHIM/localchat/$sub"; done
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi -L 2>/dev/null || true
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    || true

declare -A STATUS
stage() {  # stage NAME SECONDS CMD...: run with a time limit, remember the exit status
    local name="$1" limit="$2"; shift 2
    echo "=== $name (limit ${limit}s) ==="
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    STATUS[$name]="rc=$rc ($((SECONDS - t0)) s)$([ $rc -eq 124 ] && echo ', timed out')"
    echo "=== $name: ${STATUS[$name]} ==="
}

summarize() {  # (re)write gpu_check.json/.md from what the stages wrote so far
    local STATUS_JSON="{"
    for k in stage0 tests kernels kgraph engine; do STATUS_JSON+="\"$k\": \"${STATUS[$k]:-not run}\", "; done
    STATUS_JSON="${STATUS_JSON%, }}"
    for f in stage0.json kernels.json kgraph.json engine.json; do
        [ -f "$PARTS/$f" ] && cp "$PARTS/$f" "$OUT_DIR/$f"
    done
    "$PY" - "$OUT_DIR" "$PARTS" "$STATUS_JSON" <<'PYEOF'
import json, sys
from pathlib import Path
out, parts, status = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
def read(name):
    p = out / name if (out / name).exists() else parts / name
    return p.read_text() if p.exists() else None
tests_txt = read("tests.txt") or ""
summary = next((ln for ln in reversed(tests_txt.splitlines()) if " passed" in ln
                or " failed" in ln or " error" in ln), "no pytest summary")
result = {"stages": status, "tests_summary": summary.strip("= "),
          "stage0": json.loads(read("stage0.json") or "null"),
          "kernels": json.loads(read("kernels.json") or "null"),
          "kgraph": json.loads(read("kgraph.json") or "null"),
          "engine": json.loads(read("engine.json") or "null")}
(out / "gpu_check.json").write_text(json.dumps(result, indent=1))
s0 = result["stage0"] or {}
md = ["# GPU check", "", f"Stages: {status}", "",
      f"Device: {s0.get('name', '?')} (sm {s0.get('capability')}, {s0.get('sm_count')} SMs, "
      f"L2 {s0.get('l2_bytes')} B); torch {s0.get('torch')}, CUDA {s0.get('cuda')}, "
      f"Triton {s0.get('triton')}; batch-1 decode sync-free: {s0.get('decode_sync_free')}",
      "", f"Tests: {result['tests_summary']}",
      "", "## Kernels (eager)", "", read("kernels.md") or "(not available)", "",
      "## Kernels at 8B shapes inside a CUDA graph, L2-rotated buffers", "",
      read("kgraph.md") or "(not available)", "",
      "## End to end through LLMEngine (random Llama-3.1-8B weights)", "",
      read("engine.md") or "(not available)"]
(out / "gpu_check.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
PYEOF
}

stage stage0 60 "$PY" scripts/gpu_stage0.py --device "$DEVICE" --out "$PARTS" \
    "${STAGE0_ARGS[@]}"
summarize >/dev/null

XDIST=()
[ "$DEVICE" = cuda ] && "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)
export OUT_DIR
stage tests 150 bash -c 'set -o pipefail; "$0" -m pytest "${@}" -q -o addopts="" \
    -p no:cacheprovider -W ignore::pytest.PytestConfigWarning 2>&1 | tee "$OUT_DIR/tests.txt"' \
    "$PY" "${TESTS[@]}" "${XDIST[@]}"
summarize >/dev/null
stage kernels 50 "$PY" scripts/bench_kernels.py --device "$DEVICE" --out "$PARTS" \
    "${KERNEL_ARGS[@]}"
summarize >/dev/null
stage kgraph 90 "$PY" scripts/gpu_kernels_graph.py --device "$DEVICE" --out "$PARTS" \
    "${KGRAPH_ARGS[@]}"
summarize >/dev/null
# Stage 3 gets what the earlier stages left of the total (GPU_CHECK_TOTAL_S, default 560 s:
# the device tool's 600 s command less start-up and the summary), at least 190 s.
ENGINE_LIMIT=$(( ${GPU_CHECK_TOTAL_S:-560} - SECONDS ))
[ "$ENGINE_LIMIT" -lt 190 ] && ENGINE_LIMIT=190
stage engine "$ENGINE_LIMIT" "$PY" scripts/gpu_engine_e2e.py --device "$DEVICE" --out "$PARTS" \
    "${ENGINE_ARGS[@]}"
summarize
rm -rf "$PARTS"
FAILED=0
for k in stage0 tests kernels kgraph engine; do
    case "${STATUS[$k]:-}" in "rc=0 "*) ;; *) FAILED=1 ;; esac
done
echo "gpu_check: $([ $FAILED = 0 ] && echo 'every stage passed' || echo 'a stage failed') ($OUT_DIR)"
exec >&- 2>&-  # let tee write the log's last lines before the files are collected
wait "$TEE_PID" 2>/dev/null
exit $FAILED
