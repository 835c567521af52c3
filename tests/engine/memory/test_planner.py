"""The memory planner against independent references.

Weight bytes: transformers' own models (built on the meta device) and the parameter counts the
model publishers state; KV bytes: the engine's allocated cache tensors; the format choice:
the issue's table (8k context: 24 GiB -> bf16, 12 GiB -> int8, 8 GiB -> int4, 4 GiB -> error)
for published configs written out by hand (no download); predicted vs measured process RSS for
SmolLM2-135M.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from localchat.engine.config import ModelConfig
from localchat.engine.memory.budget import (
    CUDA_RUNTIME_OVERHEAD,
    DeviceSpec,
    default_budget_bytes,
    parse_size,
)
from localchat.engine.memory.footprint import kv_bytes, weight_bytes
from localchat.engine.memory.planner import (
    MIN_CONTEXT_LEN,
    MemoryPlanError,
    format_weight_bytes,
    plan_memory,
)
from tests.engine.tiny_models import ARCHS, make_config

GiB = 2**30
# A CUDA device without fp8 (cc < 8.9) and one with it; bf16 is their unquantized format.
CUDA = DeviceSpec("cuda", "test GPU", native_bf16=True, fp8=False,
                  runtime_overhead_bytes=CUDA_RUNTIME_OVERHEAD)
CUDA_FP8 = DeviceSpec("cuda", "test GPU (cc 8.9)", native_bf16=True, fp8=True,
                      runtime_overhead_bytes=CUDA_RUNTIME_OVERHEAD)

# config.json values as published on the Hub (meta-llama/Llama-3.1-8B-Instruct,
# Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-0.5B-Instruct), and the parameter counts their
# safetensors metadata reports.
LLAMA_31_8B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
QWEN25_7B = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064,
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "max_position_embeddings": 32768, "tie_word_embeddings": False, "sliding_window": 131072,
    "use_sliding_window": False,
}
QWEN25_05B = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "max_position_embeddings": 32768, "tie_word_embeddings": True, "sliding_window": 131072,
    "use_sliding_window": False,
}
PUBLISHED_PARAMS = {"llama-3.1-8b": 8_030_261_248, "qwen2.5-7b": 7_615_616_512,
                    "qwen2.5-0.5b": 494_032_768}
CONFIGS = {"llama-3.1-8b": LLAMA_31_8B, "qwen2.5-7b": QWEN25_7B, "qwen2.5-0.5b": QWEN25_05B}
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_config(name: str) -> ModelConfig:
    from transformers import AutoConfig

    d = dict(CONFIGS[name])
    return ModelConfig.from_hf_config(AutoConfig.for_model(d.pop("model_type"), **d))


def hf_meta_model(hf_config):
    """transformers' model for ``hf_config`` with meta tensors (shapes only)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)


def reference_bytes(hf_model, fmt: str, act: int, scale: int) -> int:
    """Bytes of ``hf_model`` in ``fmt``, from transformers' parameter list: decoder linear
    weights quantized (``scale`` bytes per scale / zero point; int4 groups of 128, else 64 or
    32 inputs), everything else ``act`` bytes per value (tied LM head counted once)."""
    total = 0
    for name, p in hf_model.named_parameters(remove_duplicate=False):
        if name == "lm_head.weight" and hf_model.config.tie_word_embeddings:
            continue
        out_f = p.shape[0]
        quantized = name.endswith(".weight") and name.split(".")[-2] in LINEAR_NAMES
        if fmt in ("fp32", "bf16"):
            total += p.numel() * {"fp32": 4, "bf16": 2}[fmt]
        elif not quantized:
            total += p.numel() * act
        elif fmt == "int8":
            total += p.numel() + out_f * scale
        elif fmt == "fp8":
            total += p.numel() + out_f * 4
        else:
            group = next(g for g in (128, 64, 32) if p.shape[1] % g == 0)
            total += p.numel() // 2 + out_f * (p.shape[1] // group) * 2 * scale
    return total


# -- weight and KV bytes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count_equals_the_published_one(name):
    config = model_config(name)
    assert weight_bytes(config, "none", "cpu", torch.float32) == 4 * PUBLISHED_PARAMS[name]
    assert weight_bytes(config, "none", "cuda", torch.bfloat16) == 2 * PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int4", "fp8"])
def test_weight_bytes_match_transformers_parameters(arch, fmt):
    hf_config = make_config(arch)
    hf_config.intermediate_size = 384  # down_proj: three int4 groups of 128
    config = ModelConfig.from_hf_config(hf_config)
    hf_model = hf_meta_model(hf_config)
    # CUDA keeps fp32 scales; on CPU int8 keeps bf16 ones, int4 fp32 ones with localchat's
    # own kernels (built) and PyTorch's int4pack bf16 pairs without (engine/quant/methods.py).
    from localchat.engine.quant.cpu_int4 import own_kernels

    got = format_weight_bytes(config, fmt, torch.bfloat16, "cuda")
    assert got == reference_bytes(hf_model, fmt, 2, 4)
    if fmt != "fp8":
        got = format_weight_bytes(config, fmt, torch.float32, "cpu")
        cpu_scale = 4 if fmt == "int4" and own_kernels() else 2
        assert got == reference_bytes(hf_model, fmt, 4, cpu_scale)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fp32_weight_bytes_match_our_model(arch):
    from localchat.engine.models import get_model_class

    config = ModelConfig.from_hf_config(make_config(arch))
    with torch.device("meta"):
        model = get_model_class(config)(config)
    assert weight_bytes(config, "none", "cpu", torch.float32) == sum(
        p.numel() * 4 for p in model.parameters())


def test_kv_bytes_equal_the_allocated_cache():
    from localchat.engine.kv_cache import allocate_kv_caches

    config = ModelConfig.from_hf_config(make_config("qwen3"))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        caches = allocate_kv_caches(config.num_hidden_layers, 5, 16, config.num_kv_heads,
                                    config.head_dim, dtype, torch.device("cpu"))
        assert kv_bytes(config, 5 * 16, dtype) == sum(t.nbytes for t in caches)


# -- the format choice -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b"])
@pytest.mark.parametrize("budget_gib, expected", [(24, "bf16"), (12, "int8"), (8, "int4")])
def test_known_configs_at_8k(name, budget_gib, expected):
    plan = plan_memory(model_config(name), budget_gib * GiB, 8192, 1, device=CUDA)
    assert (plan.format, plan.context_len, plan.note) == (expected, 8192, None)
    order = [r.format for r in plan.rows]
    assert order == ["bf16", "int8", "int4"]
    # Every better format does not fit; the chosen one does; parts add up.
    for r in plan.rows[: order.index(expected)]:
        assert not r.fits
    c = plan.choice
    assert c.fits and c.margin_bytes == budget_gib * GiB - c.total_bytes
    assert c.total_bytes == (c.weight_bytes + c.kv_bytes + c.activation_bytes
                             + c.overhead_bytes)
    assert c.kv_bytes == kv_bytes(model_config(name), 8192, torch.bfloat16)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b"])
def test_known_configs_at_4gib_error_with_numbers(name):
    with pytest.raises(MemoryPlanError) as err:
        plan_memory(model_config(name), 4 * GiB, 8192, 1, device=CUDA)
    msg = str(err.value)
    assert "4.00 GiB" in msg and "int4" in msg and f"{MIN_CONTEXT_LEN} tokens" in msg
    int4 = weight_bytes(model_config(name), "int4", "cuda", torch.bfloat16)
    assert f"weights {int4 / GiB:.2f} GiB" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("budget_gib", [24, 12, 8, 4])
def test_small_model_fits_unquantized_everywhere(budget_gib):
    plan = plan_memory(model_config("qwen2.5-0.5b"), budget_gib * GiB, 8192, 1, device=CUDA)
    assert plan.format == "bf16" and plan.context_len == 8192


def test_fp8_only_where_the_device_has_it():
    llama = model_config("llama-3.1-8b")
    assert plan_memory(llama, 12 * GiB, 8192, device=CUDA_FP8).format == "fp8"
    assert "fp8" not in [r.format for r in plan_memory(llama, 12 * GiB, 8192, device=CUDA).rows]
    with pytest.raises(ValueError, match="fp8"):
        plan_memory(llama, 12 * GiB, 8192, device=CUDA, quant="fp8")


def test_cpu_without_native_bf16_plans_fp32():
    cpu = DeviceSpec("cpu", "CPU", native_bf16=False, fp8=False, runtime_overhead_bytes=0)
    config = model_config("qwen2.5-0.5b")
    plan = plan_memory(config, 64 * GiB, 4096, 1, device=cpu)
    assert [r.format for r in plan.rows] == ["fp32", "int8", "int4"]
    assert plan.choice.weight_bytes == 4 * PUBLISHED_PARAMS["qwen2.5-0.5b"]
    # the KV cache of an fp32 CPU engine is fp16 by default (CacheConfig.kv_cache_dtype)
    assert plan.choice.kv_bytes == kv_bytes(config, 4096, torch.float16)
    fp32_kv = plan_memory(config, 64 * GiB, 4096, 1, device=cpu, kv_cache_dtype="float32")
    assert fp32_kv.choice.kv_bytes == kv_bytes(config, 4096, torch.float32)


def test_draft_model_is_accounted_for():
    target, draft = model_config("qwen2.5-7b"), model_config("qwen2.5-0.5b")
    alone = plan_memory(target, 24 * GiB, 8192, 1, device=CUDA)
    both = plan_memory(target, 24 * GiB, 8192, 1, draft=draft, device=CUDA)
    for a, b in zip(alone.rows, both.rows):
        assert b.draft_weight_bytes == format_weight_bytes(draft, a.format, torch.bfloat16, "cuda")
        assert b.draft_kv_bytes == kv_bytes(draft, 8192, torch.bfloat16)
        assert b.activation_bytes >= a.activation_bytes  # k + 1 logit rows per sequence
        assert b.total_bytes > a.total_bytes + b.draft_weight_bytes + b.draft_kv_bytes - 1
    # A budget where the target alone fits in int8 but target + draft does not: int4.
    int8_alone = alone.rows[1].total_bytes
    budget = int8_alone + both.rows[1].draft_weight_bytes // 2
    assert plan_memory(target, budget, 8192, 1, device=CUDA).format == "int8"
    assert plan_memory(target, budget, 8192, 1, draft=draft, device=CUDA).format == "int4"


def test_context_is_lowered_to_the_largest_that_fits():
    llama = model_config("llama-3.1-8b")
    int4_at = lambda n: plan_memory(llama, 10**15, n, 1, device=CUDA).rows[-1].total_bytes
    budget = (int4_at(8192) + int4_at(MIN_CONTEXT_LEN)) // 2
    plan = plan_memory(llama, budget, 8192, 1, device=CUDA)
    ctx = plan.context_len
    assert plan.format == "int4" and MIN_CONTEXT_LEN <= ctx < 8192 and ctx % 16 == 0
    assert int4_at(ctx) <= budget < int4_at(ctx + 16)
    assert f"from 8192 to {ctx} tokens" in plan.note
    assert plan.rows[-1].context_len == 8192 and not plan.rows[-1].fits


def test_forced_format():
    llama = model_config("llama-3.1-8b")
    plan = plan_memory(llama, 24 * GiB, 8192, device=CUDA, quant="int4")
    assert (plan.format, plan.forced) == ("int4", True)
    assert plan_memory(llama, 24 * GiB, 8192, device=CUDA, quant="none").format == "bf16"
    with pytest.raises(MemoryPlanError, match="the forced format does not fit in 12.00 GiB: "
                                              "bf16 needs"):
        plan_memory(llama, 12 * GiB, 8192, device=CUDA, quant="bf16")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["choice"]["format"] == "int4" and len(data["rows"]) == 3


def test_hypothetical_cuda_needs_permission():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="--memory"):
        DeviceSpec.detect("cuda")
    spec = DeviceSpec.detect("cuda", allow_hypothetical=True)
    assert spec.hypothetical and spec.native_bf16 and not spec.fp8


def test_budget_and_sizes():
    assert default_budget_bytes("cpu", available=100 * GiB) == 90 * GiB
    assert default_budget_bytes("cpu", available=4 * GiB) == 3 * GiB
    assert default_budget_bytes("cuda", available=20 * GiB) == 19 * GiB
    assert parse_size("12GiB") == 12 * GiB
    assert parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("500mib") == 500 * 2**20
    assert parse_size("4096") == 4096
    for bad in ("", "12 parsecs", "-1G", "0", "GiB"):
        with pytest.raises(ValueError):
            parse_size(bad)


# -- predicted vs measured -------------------------------------------------------------------

_MEASURE = r"""
import json, sys, torch
from pathlib import Path
from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.memory.report import memory_report
torch.set_num_threads(1)
cfg = EngineConfig(device="cpu", dtype=torch.float32, quant=QuantConfig(scheme=sys.argv[3]),
                   scheduler=SchedulerConfig(max_model_len=2048, max_num_seqs=1))
engine = LLMEngine.from_path(Path(sys.argv[1]), cfg, cache_dir=Path(sys.argv[2]))
for t in engine.runner.kv_caches:  # a full context: every KV page written
    t.zero_()
model = engine.runner.model
for t in list(model.parameters()) + list(model.buffers()):  # every weight page read once, as a
    if t.is_contiguous() and t.numel():  # forward would (native maps its cache: pages load lazily)
        t.view(-1).view(torch.uint8)[::1024].sum()
r = memory_report(engine)
model = engine.runner.model
params = sum(p.nbytes for p in model.parameters())
params += sum(b.nbytes for n, b in model.named_buffers() if not n.endswith("cos_sin_cache"))
params += sum(m.weight_t.nbytes for m in model.modules() if getattr(m, "weight_t", None) is not None)
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
peak = int(status["VmHWM"].split()[0]) * 1024
print(json.dumps(dict(predicted=r.predicted_bytes, measured=r.measured_bytes, peak=peak,
                      weights=r.weight_bytes, kv=r.kv_bytes, params=params,
                      kv_alloc=sum(t.nbytes for t in engine.runner.kv_caches))))
"""


# "native" maps its cache (the int4 layers too, with localchat's own int4 kernels; pages load
# when first read, so the measurement reads every weight page first).
@pytest.mark.parametrize("scheme", ["none", "int8", "int4", "native"])
def test_predicted_vs_measured_rss_smollm2(smollm2_gguf, cache_dir, scheme):
    """Process RSS of a fresh process holding SmolLM2-135M (fp32 activations, 2,048-token KV
    pool, all pages written) is within 10% of the plan; the weight bytes equal the bytes of
    the loaded tensors and the KV bytes those of the allocated cache. The quantized weights
    land in the user cache, which later loads (and the quantization tests) reuse."""
    def measure() -> dict:
        out = subprocess.run([sys.executable, "-c", _MEASURE, str(smollm2_gguf),
                              str(cache_dir), scheme],
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    # The first load of a format fills the caches (quantized weights, the derived config,
    # the converted tokenizer) and imports transformers to do it; the allocator keeps part of
    # that transient. Steady state is a load from the caches, which is what the plan predicts.
    measure()
    r = measure()
    assert r["weights"] == r["params"] and r["kv"] == r["kv_alloc"]
    assert abs(r["measured"] - r["predicted"]) <= 0.10 * r["measured"], r
    if scheme == "native":
        # a cached native load maps the cache and repacks one int4 layer at a time: the peak
        # stays within 1.2x of what the process holds afterwards (weights + KV + runtime)
        assert r["peak"] <= 1.2 * r["measured"], r


def test_refusal_names_the_native_format_when_it_is_the_smallest():
    """Under ``auto`` a GGUF's own format is tried last; when nothing fits, the error names
    the smallest format tried, native included, at the floor context (its weight bytes as
    given), not a larger requantized one."""
    llama = model_config("llama-3.1-8b")
    int4 = plan_memory(llama, 64 * GiB, MIN_CONTEXT_LEN, device=CUDA, quant="int4").choice
    native_bytes = int4.weight_bytes // 2
    with pytest.raises(MemoryPlanError) as err:
        plan_memory(llama, 1 * GiB, 8192, device=CUDA, native_weight_bytes=native_bytes)
    message = str(err.value)
    assert message.startswith("no format fits in 1.00 GiB: native needs ")
    want = int4.total_bytes - int4.weight_bytes + native_bytes
    assert f"native needs {want / GiB:.2f} GiB at {MIN_CONTEXT_LEN} tokens" in message


def test_memory_report_counts_the_draft_model(smollm2_gguf, cache_dir):
    """With a draft model (SmolLM2 drafting for itself) the report's weights and KV are the
    target's plus the draft's: its weights the same bytes again (same file, same format) and
    its KV the bytes of the draft pool actually allocated."""
    from localchat.engine.config import (
        EngineConfig,
        QuantConfig,
        SchedulerConfig,
        SpeculativeConfig,
    )
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.memory.report import memory_report

    def engine(draft):
        cfg = EngineConfig(device="cpu", dtype=torch.float32, quant=QuantConfig(scheme="int8"),
                           scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=1),
                           speculative=SpeculativeConfig(draft_model=draft))
        return LLMEngine.from_path(smollm2_gguf, cfg, cache_dir=cache_dir)

    plain, drafted = memory_report(engine(None)), engine(str(smollm2_gguf))
    both = memory_report(drafted)
    assert both.weight_bytes == 2 * plain.weight_bytes
    draft_kv = sum(t.nbytes for t in drafted.speculator.proposer.kv_caches)
    target_kv = sum(t.nbytes for t in drafted.runner.kv_caches)
    assert both.kv_bytes == target_kv + draft_kv and draft_kv > 0
    assert both.predicted_bytes == both.weight_bytes + both.kv_bytes + both.overhead_bytes
    # ask --json's measured side counts the draft's tensors too (each storage once)
    from localchat.app.memory_figures import memory_figures
    from localchat.engine.memory.report import allocated_bytes, module_tensors

    figures = memory_figures(drafted)
    draft_alloc = allocated_bytes(module_tensors(drafted.speculator.proposer.model)
                                  + list(drafted.speculator.proposer.kv_caches))
    assert figures["predicted_bytes"] == both.weight_bytes + both.kv_bytes
    target_alloc = allocated_bytes(module_tensors(drafted.runner.model)
                                   + list(drafted.runner.kv_caches))
    assert draft_alloc > draft_kv > 0
    assert figures["measured_bytes"] == target_alloc + draft_alloc
