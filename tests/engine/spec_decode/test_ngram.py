"""Prompt lookup drafts (``spec_decode/ngram.py``): the lookup against a brute-force search,
greedy output with n-gram drafts equal to plain greedy on SmolLM2 (fp32 and bf16, float and
native weights) on a reply that copies its prompt, the drafts' one-hot distributions keeping
sampled output on the target's distribution, and the wiring (``--draft ngram``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.config import SpeculativeConfig
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_decode.ngram import MAX_NGRAM, MIN_NGRAM, NgramProposer, lookup
from localchat.engine.spec_decode.rejection_sampler import rejection_sample
from localchat.engine.spec_decode.speculator import Speculator


def brute_force(tokens: list[int], k: int) -> list[int]:
    """The longest suffix (MAX_NGRAM..MIN_NGRAM) found earlier, its latest occurrence."""
    n_tok = len(tokens)
    for n in range(min(MAX_NGRAM, n_tok - 1), MIN_NGRAM - 1, -1):
        suffix = tokens[n_tok - n:]
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(1, 8))
def test_lookup_equals_a_brute_force_search(tokens, k):
    assert lookup(np.array(tokens, dtype=np.int64), k) == brute_force(tokens, k)


def test_lookup_prefers_the_longest_then_the_latest_match():
    # [2, 3, 4] occurs at 1 and 7; [9, 2, 3, 4] only at 6: the 4-gram wins
    tokens = [1, 2, 3, 4, 5, 9, 9, 2, 3, 4, 7, 9, 2, 3, 4]
    assert lookup(np.array(tokens), 2) == [7, 9]
    tokens = [1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3]  # the latest [1, 2, 3]
    assert lookup(np.array(tokens), 3) == [6, 1, 2]
    assert lookup(np.array([1, 2, 5, 1, 2]), 4) == []  # a 2-gram is too short to draft from
    assert lookup(np.array([7]), 4) == []


def test_sampled_requests_get_one_hot_draft_distributions():
    from localchat.engine.request import Request

    prop = NgramProposer(vocab_size=10, device=torch.device("cpu"))
    ids = [1, 2, 3, 4, 1, 2, 3]
    greedy = Request("g", ids, SamplingParams(temperature=0.0))
    sampled = Request("s", ids, SamplingParams(temperature=0.8))
    drafts = prop.propose([greedy, sampled], {"g": 3, "s": 2}, {})
    assert drafts == {"g": [4, 1, 2], "s": [4, 1]}
    assert set(prop.draft_probs) == {"s"}
    assert torch.equal(prop.draft_probs["s"], torch.eye(10)[[4, 1]])


def test_one_hot_drafts_keep_the_target_distribution():
    """With q one-hot on the drafted token, the first emitted token is drawn from p."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.4, 0.25, 0.05])
    rows = 40_000
    target = p.expand(rows, 2, 5).contiguous()
    draft = torch.zeros(rows, 1, 5)
    draft[:, 0, 2] = 1.0
    ids = torch.full((rows, 1), 2, dtype=torch.int64)
    accepted, nxt = rejection_sample(target, draft, ids, g)
    first = torch.where(accepted == 1, ids[:, 0], nxt)
    freq = torch.bincount(first, minlength=5).double() / rows
    sigma = (p.double() * (1 - p.double()) / rows).sqrt()
    assert ((freq - p.double()).abs() <= 5 * sigma).all(), (freq, p)


COPY = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")


@pytest.fixture(scope="module", params=[("float32", "none"), ("bfloat16", "none"),
                                        ("bfloat16", "native")], ids=lambda p: "-".join(p))
def smollm2(request, smollm2_gguf, cache_dir):
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    dtype, scheme = request.param
    config = EngineConfig(device="cpu", dtype=getattr(torch, dtype),
                          quant=QuantConfig(scheme=scheme),
                          scheduler=SchedulerConfig(max_model_len=2048))
    return LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)


def test_smollm2_with_ngram_drafts_equals_plain_greedy(smollm2):
    import dataclasses

    from localchat.engine.llm_engine import LLMEngine

    base = smollm2
    config = dataclasses.replace(base.config, speculative=SpeculativeConfig(
        method="ngram", num_speculative_tokens=4, adaptive=False))
    eng = LLMEngine(base.runner.model, base.model_config, base.tokenizer, config,
                    base.max_model_len)
    eng.speculator = Speculator.build_ngram(base.model_config, config, eng.max_model_len)
    ids = base.tokenizer.apply_chat_template([{"role": "user", "content":
                                               f"{COPY}\nRepeat this code exactly."}])
    sp = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    *_, want = base.generate(ids, sp)
    *_, got = eng.generate(ids, sp)
    assert got.output_token_ids == want.output_token_ids
    stats = eng.get_stats().spec
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > 0
    assert eng.get_info().draft == "ngram"


def test_draft_ngram_configures_prompt_lookup():
    from localchat.app.engine_loader import NGRAM, engine_config
    from localchat.app.load_options import LoadOptions

    config = engine_config(LoadOptions(model="smollm2-135m", draft="ngram"), NGRAM)
    assert config.speculative.method == "ngram" and config.speculative.enabled
    assert not SpeculativeConfig().enabled
    with pytest.raises(ValueError, match="speculative method"):
        SpeculativeConfig(method="medusa")
