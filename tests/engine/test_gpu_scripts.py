"""The GPU check's stage 2b and stage 3 scripts, run on CPU at tiny sizes before any GPU sees
them (``scripts/gpu_kernels_graph.py``, ``scripts/gpu_engine_e2e.py``).

Checked against independent references: the engine built the way stage 3 builds it (in-memory
random Llama, offline tokenizer) decodes greedily the same tokens as transformers'
``LlamaForCausalLM`` holding the same weights (so the side-by-side row compares one model);
its prefix-cached TTFT request really hits the cache and its speculative row really verifies
drafts; stage 2b's kernels match their references on every row, and its buffer rotation reads
more than twice the L2 per pass. Figures are not checked (CPU timings mean nothing).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SCRIPTS))


def test_rotation_reads_past_twice_the_l2():
    kg = _load("gpu_kernels_graph")
    l2 = 60 * 2**20
    for nbytes in (8 * 2**20, 16 * 2**20, 50 * 2**20, 2**30):  # o int4 .. LM head bf16
        n = kg.num_copies(nbytes, l2)
        assert n >= 2 and n * nbytes > 2 * l2
        assert (n - 2) * nbytes <= 2 * l2  # no more copies than needed (plus one)


def test_kernels_graph_stage_checks_every_row(tmp_path):
    kg = _load("gpu_kernels_graph")
    assert kg.main(["--device", "cpu", "--tiny", "--rows", "1", "--calls", "2",
                    "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "kgraph.json").read_text())["rows"]
    ops = {r["op"] for r in rows}
    assert ops == {"qkv", "o", "gate_up", "down", "lm_head", "decode attention"}
    assert all(r["rel_err"] <= 2e-2 and r["us"] is not None for r in rows)
    assert {r["impl"] for r in rows} >= {"F.linear bf16", "int8_matmul (per channel)",
                                         "fp8 _scaled_mm", "SDPA contiguous KV",
                                         "paged_attention_decode"}


def test_engine_stage_model_equals_transformers(tmp_path):
    e2e = _load("gpu_engine_e2e")
    from localchat.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from localchat.engine.sampling_params import SamplingParams

    cfg = e2e.model_config(tiny=True)
    device = torch.device("cpu")
    model = e2e.build_model(cfg, torch.float32, device, 256)
    tok = e2e.offline_tokenizer(cfg.vocab_size, tmp_path / "tok")
    config = EngineConfig(device="cpu", dtype=torch.float32,
                          cache=CacheConfig(kv_cache_memory_bytes=16 * 2**20),
                          scheduler=SchedulerConfig(max_model_len=256))
    engine, _ = e2e.make_engine(model, cfg, tok, config, 256)
    prompt = torch.randint(0, cfg.vocab_size - 1, (24,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    outs = list(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8,
                                                       ignore_eos=True)))
    ours = outs[-1].output_token_ids
    hf = _load("gpu_hf_side").hf_llama_from(model, cfg, device, torch.float32)
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
                          min_new_tokens=8, pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref


def test_engine_stage_runs_every_row_on_cpu(tmp_path):
    e2e = _load("gpu_engine_e2e")
    rc = e2e.main(["--device", "cpu", "--tiny", "--steps", "3", "--context", "40",
                   "--batch-sizes", "1,3", "--max-model-len", "256", "--no-hf",
                   "--schemes", "int4,bf16", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "engine.json").read_text())
    # bf16 runs first (the quantized formats replace the float weights in place)
    assert [(r["weights"], r["batch"], r["running"]) for r in res["rows"]] == [
        ("bf16", 1, 1), ("bf16", 3, 3), ("int4", 1, 1), ("int4", 3, 3)]
    ttft = res["ttft"]
    # the second prompt shares all but its last 64 tokens: whole blocks of them are cached
    assert ttft["cached_tokens"] == (ttft["prompt_tokens"] - 64) // 16 * 16
    assert "num_verify_steps=" in res["speculative"]["spec_stats"]
    assert "num_verify_steps=0," not in res["speculative"]["spec_stats"]
