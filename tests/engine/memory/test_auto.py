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


def test_default_engine_config_loads_smollm2_unquantized(smollm2_engine):
    # The session engine was built with the default EngineConfig (quant "auto"): SmolLM2 fits
    # in fp32 on any machine that runs the tests, so the planner keeps it unquantized.
    assert smollm2_engine.config.quant.scheme == "none"
