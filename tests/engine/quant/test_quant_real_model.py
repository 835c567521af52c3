"""SmolLM2-135M (GGUF Q4_1): quantized formats against the unquantized model.

One teacher-forced forward pass over 256 positions of a fixed text per format; the reference
is our own fp32 model on the same file (feature on vs feature off). Perplexities are printed
(``-s``) and reported by ``scripts/bench_quant.py``.

Top-1 agreement alone is decided by near-ties: int8's disagreements on this text all sit where
the reference's top two logits are within 0.13 of each other, and which of them flip depends on
the CPU's kernels (97.3% on an AMD AVX2 machine, 96.9% on an Intel AVX-512 one). So each scheme
must (1) agree at every *decisive* position, where the reference's top-1 leads by more than
``DECISIVE_GAP`` logits (about 4x the largest gap at a measured disagreement), and (2) keep an
overall agreement floor set well below what any machine measured.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.config import QuantConfig
from localchat.engine.loader import load_model
from localchat.engine.quant.evaluate import (
    EVAL_TEXT,
    perplexity,
    teacher_forced_logits,
    top1_agreement,
)

POSITIONS = 256
DECISIVE_GAP = 0.5  # logits; measured disagreements: int8 <= 0.13, int4 <= 0.03


@pytest.fixture(scope="module")
def reference(smollm2_engine):
    ids = smollm2_engine.tokenizer.encode(EVAL_TEXT)[: POSITIONS + 1]
    assert len(ids) == POSITIONS + 1
    return ids, teacher_forced_logits(smollm2_engine.runner.model, ids)


@pytest.mark.parametrize("scheme, floor", [("int8", 0.94), ("int4", 0.85)])
def test_top1_agreement_with_unquantized(smollm2_gguf, smollm2_engine, cache_dir, reference,
                                         scheme, floor):
    ids, want = reference
    model = load_model(smollm2_gguf, smollm2_engine.model_config, dtype=torch.float32,
                       device=torch.device("cpu"), max_position=512, cache_dir=cache_dir,
                       quant=QuantConfig(scheme=scheme, use_cache=False))
    got = teacher_forced_logits(model, ids)
    agreement = top1_agreement(got[:POSITIONS], want[:POSITIONS])
    print(f"{scheme}: top-1 agreement {agreement:.3f}, perplexity {perplexity(got, ids):.2f} "
          f"(unquantized {perplexity(want, ids):.2f})")
    assert agreement >= floor
    top2 = want[:POSITIONS].topk(2, dim=-1).values
    decisive = (top2[:, 0] - top2[:, 1]) > DECISIVE_GAP
    flipped = decisive & (got[:POSITIONS].argmax(-1) != want[:POSITIONS].argmax(-1))
    assert decisive.sum() >= POSITIONS // 2, "the text should have mostly decisive positions"
    assert not flipped.any(), f"top-1 changed at decisive positions {flipped.nonzero().tolist()}"
