"""``--quant auto`` at load time: the planner's choice maps to the scheme that is loaded.

References: ``plan_memory``'s own choice for the same config and budget (its tables are pinned
by ``test_planner.py``), and the real engine on SmolLM2, which fits unquantized here.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.memory.auto import choose_scheme
from localchat.engine.memory.budget import DeviceSpec
from localchat.engine.memory.planner import MemoryPlanError, plan_memory

from .test_planner import GiB, model_config


@pytest.mark.parametrize(("native_bf16", "budget_gib", "scheme"), [
    (False, 64, "none"), (False, 16, "int8"), (False, 12, "int4"),
    # With native bf16 the unquantized format and the KV cache take half the bytes, so int8
    # still fits in 12 GiB.
    (True, 64, "none"), (True, 16, "int8"), (True, 12, "int8"),
])
def test_choice_maps_the_planner_format_to_a_scheme(monkeypatch, native_bf16, budget_gib,
                                                    scheme):
    # A fixed CPU description, so the expectation holds on every CPU kind (AVX2, AVX-512 VNNI,
    # AVX-512 BF16) rather than on the one that runs the test.
    spec = DeviceSpec("cpu", "CPU", native_bf16, False, DeviceSpec.detect("cpu").runtime_overhead_bytes)
    monkeypatch.setattr(DeviceSpec, "detect", classmethod(lambda cls, kind="cpu", **_: spec))
    cfg = model_config("llama-3.1-8b")
    got, plan = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=budget_gib * GiB)
    want = plan_memory(cfg, budget_gib * GiB, 8192, 1, None, spec)
    assert plan.format == want.format and got == scheme


def test_no_format_fits_is_a_clear_error():
    with pytest.raises(MemoryPlanError, match="GiB"):
        choose_scheme(model_config("llama-3.1-8b"), torch.device("cpu"), 8192,
                      budget_bytes=2 * GiB)


@pytest.mark.parametrize("built", [True, False])
def test_auto_offers_native_on_cpu_only_with_the_cpp_kernels(monkeypatch, smollm2_gguf,
                                                              smollm2_engine, cache_dir, built):
    # SmolLM2's native weights (Q4_1 + Q8_0, ~0.1 GB) hold less than any format the planner
    # can fit here: on CPU auto picks them when localchat's C++ kernels serve every layer
    # (own int4 kernels, the C++ int8 kernels); without them (PyTorch's int4 kernel: bf16
    # scales and mins, which changes the greedy answer to the README's question; the int8
    # layers' fp32 row blocks) it keeps the planner's float choice. On CUDA always.
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine_build import resolve_auto_quant
    from localchat.engine.loader import native as native_loader
    from localchat.engine.loader.native import native_is_fast
    from localchat.engine.quant import cpu_int4, native

    monkeypatch.setattr(native, "_cpu_kernel_rows", lambda: 16 if built else 0)
    monkeypatch.setattr(cpu_int4, "own_kernels", lambda: built)
    config, _ = resolve_auto_quant(smollm2_gguf, smollm2_engine.model_config,
                                   EngineConfig(device="cpu"), 2048, cache_dir)
    assert native_is_fast(smollm2_gguf, "cpu", cache_dir) is built
    assert (config.quant.scheme == "native") is built
    assert native_is_fast(smollm2_gguf, "cuda", cache_dir)
    # a file whose layers are all group-wise int8 (Q8_0-like) or float: the int8 kernels decide
    monkeypatch.setattr(native_loader, "_layout_of",
                        lambda t: ("int8", 32) if t["name"].endswith("weight") else ("float", 0))
    assert native_is_fast(smollm2_gguf, "cpu", cache_dir) is built
    monkeypatch.setattr(native_loader, "_layout_of", lambda t: ("float", 0))
    assert native_is_fast(smollm2_gguf, "cpu", cache_dir)


def test_native_loses_to_a_smaller_forced_format():
    # ... but not when its bytes exceed the planner's choice (the plan forces smaller)
    cfg = model_config("llama-3.1-8b")
    plan_scheme, plan = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=12 * GiB)
    got, _ = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=12 * GiB,
                           native_bytes=plan.choice.weight_bytes + 1)
    assert got == plan_scheme != "native"
    got, _ = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=12 * GiB,
                           native_bytes=plan.choice.weight_bytes)
    assert got == "native"


def test_native_planned_when_no_other_format_fits():
    # A GGUF whose own format is smaller than any requantized copy (a Q4_K file against int4
    # with fp32 embedding and LM head) is planned in it rather than refused ...
    cfg = model_config("llama-3.1-8b")
    with pytest.raises(MemoryPlanError):
        choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=4 * GiB)
    got, plan = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=4 * GiB,
                              native_bytes=2 * GiB)
    assert got == "native" and plan.format == "native"
    assert plan.choice.weight_bytes == 2 * GiB and plan.choice.total_bytes <= 4 * GiB
    # ... at a lowered context when the full one does not fit, and never past the budget
    tight = plan.choice.total_bytes - plan.choice.kv_bytes // 2
    got, low = choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=tight,
                             native_bytes=2 * GiB)
    assert got == "native" and low.context_len < 8192 and low.choice.total_bytes <= tight
    with pytest.raises(MemoryPlanError):
        choose_scheme(cfg, torch.device("cpu"), 8192, budget_bytes=4 * GiB,
                      native_bytes=4 * GiB)


def test_native_planned_with_a_draft_when_both_files_have_their_own_format():
    """A GGUF target with a GGUF draft: both in their own formats count (the draft's exact
    bytes in ``draft_weight_bytes``) when nothing requantized fits; a draft without its own
    format (an HF folder: ``draft_native_bytes`` None) keeps native out, since the loader
    could not load it so."""
    cfg, draft = model_config("llama-3.1-8b"), model_config("qwen2.5-0.5b")
    with pytest.raises(MemoryPlanError):
        choose_scheme(cfg, torch.device("cpu"), 8192, draft=draft, budget_bytes=5 * GiB,
                      native_bytes=2 * GiB)
    got, plan = choose_scheme(cfg, torch.device("cpu"), 8192, draft=draft,
                              budget_bytes=5 * GiB, native_bytes=2 * GiB,
                              draft_native_bytes=GiB // 4)
    assert got == "native" and plan.format == "native"
    c = plan.choice
    assert (c.weight_bytes, c.draft_weight_bytes) == (2 * GiB, GiB // 4)
    assert c.total_bytes == (c.weight_bytes + c.kv_bytes + c.draft_weight_bytes
                             + c.draft_kv_bytes + c.activation_bytes + c.overhead_bytes)
    assert c.total_bytes <= 5 * GiB
