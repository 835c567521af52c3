"""The AMX-INT8 W4A8 kernel (``kernels/cpu/qa8_amx.cpp``, ``LOCALCHAT_CPU_AMX_DECODE=1``)
through a whole model: SmolLM2-135M in its own format (its Q4_1 layers on the tile kernel),
bf16 activations, teacher-forced logits of 48 tokens.

- Batch invariance end to end: the logits of forwards of 5 and 16 rows (verification) equal
  those of one-row forwards (decode) bit for bit.
- Against the VNNI path (the switch off): the two differ only in the fp32 order of the same
  exact per-block integer dots, amplified by bf16 rounding through 30 layers; measured
  0.033 x the largest logit on an AMX Xeon, bound at 0.15 x. On a CPU without AMX-INT8 the
  switch is a no-op and the two runs are equal.
The kernel itself is tested against the PyTorch reference in ``tests/kernels``.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.evaluate import EVAL_TEXT, teacher_forced_logits
from localchat.kernels import cpu

pytestmark = [pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: nothing to test")]


def test_smollm2_amx_decode_is_batch_invariant_and_close(smollm2_gguf, cache_dir,
                                                         monkeypatch):
    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model, load_model_config
    from localchat.engine.tokenizer import Tokenizer

    model = load_model(smollm2_gguf, load_model_config(smollm2_gguf, cache_dir),
                       dtype=torch.bfloat16, device=torch.device("cpu"), max_position=512,
                       cache_dir=cache_dir, quant=QuantConfig(scheme="native"))
    ids = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache_dir).encode(EVAL_TEXT)[:48]
    out = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(cpu.amx.AMX_DECODE_ENV, flag)
        assert (cpu.int4_a8_isa() == cpu.AMX_INT8_LEVEL) == (flag == "1" and cpu.has_amx_int8())
        with torch.inference_mode():
            out[flag] = [teacher_forced_logits(model, ids, chunk=c) for c in (1, 5, 16)]
    one, five, sixteen = out["1"]
    assert torch.equal(one, five) and torch.equal(one, sixteen)
    vnni = out["0"][0]
    assert bool(torch.isfinite(one).all())
    assert (one - vnni).abs().max() <= 0.15 * vnni.abs().max()
    if not cpu.has_amx_int8():
        assert torch.equal(one, vnni)
