"""Draft-model speculative decoding on tiny random models (same 256-token vocabulary).

Two independently initialised random models agree rarely, so almost every step rejects and
rolls back: the strongest test of the bookkeeping. References: greedy output without a draft
(token for token), the target used as its own draft (every draft accepted), and the chained
block hashes of the true token sequences (no cached block may hold a rejected token).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localchat.engine.config import (
    CacheConfig,
    EngineConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from localchat.engine.errors import ModelLoadError
from localchat.engine.kv_cache.manager import hash_block_tokens
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_decode.speculator import Speculator, check_vocab
from localchat.engine.tokenizer import Tokenizer

from ..tiny_models import save_tiny_model

MAX_LEN = 256


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2_gguf, cache_dir):
    """(target folder, draft folder, a tokenizer) — the tokenizer only detokenizes ids < 256."""
    root = tmp_path_factory.mktemp("spec")
    save_tiny_model("llama", root / "target", seed=0)
    save_tiny_model("llama", root / "draft", seed=1)
    return root / "target", root / "draft", Tokenizer.from_pretrained(smollm2_gguf,
                                                                       cache_dir=cache_dir)


def build(tiny, k: int | None, *, draft: str = "draft", block_size: int = 4,
          adaptive: bool = False, caching: bool = True, budget: int = 2048,
          draft_vocab: int | None = 65536) -> LLMEngine:
    target, draft_dir, tok = tiny
    folder = {"draft": draft_dir, "target": target}[draft]
    config = EngineConfig(
        device="cpu", dtype=torch.float32,
        cache=CacheConfig(block_size=block_size, num_blocks=512 // block_size,
                          enable_prefix_caching=caching),
        scheduler=SchedulerConfig(max_model_len=MAX_LEN, max_num_seqs=4,
                                  max_num_batched_tokens=budget),
        speculative=SpeculativeConfig(draft_model=str(folder) if k else None,
                                      num_speculative_tokens=k or 4, adaptive=adaptive,
                                      draft_vocab_size=draft_vocab))
    mc = load_model_config(target)
    model = load_model(target, mc, dtype=torch.float32, device=torch.device("cpu"),
                       max_position=MAX_LEN)
    eng = LLMEngine(model, mc, tok, config, MAX_LEN)
    if k:
        eng.speculator = Speculator.load(Path(folder), mc, config, 512, MAX_LEN)
    return eng


def generate(eng: LLMEngine, prompts: dict[str, list[int]], max_tokens: int = 24,
             **params) -> dict[str, list[int]]:
    sp = SamplingParams(**{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True,
                           **params})
    for rid, ids in prompts.items():
        eng.add_request(rid, ids, sp)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.output_token_ids
    return done


PROMPTS = {"p3": [5, 17, 99], "p4": [1, 2, 3, 4], "p5": [200, 3, 3, 7, 11],
           "p9": list(range(30, 39)), "p17": [i * 7 % 251 for i in range(17)]}


@pytest.fixture(scope="module")
def plain_outputs(tiny):
    eng = build(tiny, None)
    return {rid: generate(eng, {rid: ids})[rid] for rid, ids in PROMPTS.items()}


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_with_a_weak_draft_equals_no_draft(tiny, plain_outputs, k):
    eng = build(tiny, k)
    got = {rid: generate(eng, {rid: ids})[rid] for rid, ids in PROMPTS.items()}
    assert got == plain_outputs
    stats = eng.get_stats().spec
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # rollbacks happened
    # Batched: all five at once give the same tokens too.
    assert generate(eng, PROMPTS) == plain_outputs
    assert eng.kv_cache_manager.usage == 0.0
    assert eng.speculator.proposer.kv.usage == 0.0


def test_target_as_its_own_draft_accepts_everything(tiny, plain_outputs):
    eng = build(tiny, 4, draft="target")
    got = {rid: generate(eng, {rid: ids})[rid] for rid, ids in PROMPTS.items()}
    assert got == plain_outputs
    stats = eng.get_stats().spec
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert stats.mean_accepted_length > 4  # k accepted + the bonus token, most steps



def test_penalties_with_drafts_equal_plain_penalized_greedy(tiny):
    """With penalties the drafts before a position count as output, in the draft
    (``DraftModelProposer``) and in the verification (``RejectionSampler``) alike: greedy output
    equals plain decoding with the same penalties, and the target drafting for itself has
    every draft accepted (the two sides penalize the same tokens)."""
    pen = {"repetition_penalty": 1.5, "presence_penalty": 0.4, "frequency_penalty": 0.3}
    plain = generate(build(tiny, None), PROMPTS, **pen)
    assert plain != generate(build(tiny, None), PROMPTS)  # the penalties change the text
    assert generate(build(tiny, 3), PROMPTS, **pen) == plain
    eng = build(tiny, 3, draft="target")
    assert generate(eng, PROMPTS, **pen) == plain
    stats = eng.get_stats().spec
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0


def test_second_turn_reuses_both_caches_and_stays_exact(tiny):
    plain = build(tiny, None)
    spec = build(tiny, 3)
    first = PROMPTS["p17"]
    out1 = generate(spec, {"t1": first})["t1"]
    assert out1 == generate(plain, {"t1": first})["t1"]
    second = first + out1 + [9, 8, 7]
    out2 = spec_out = generate(spec, {"t2": second})
    assert spec_out == generate(plain, {"t2": second})
    del out2
    # The draft's own prefix cache served turn 2 as well.
    assert spec.speculator.proposer.kv.stats.hits >= (len(first) + len(out1) - 1) // 4 * 4 - 4


def chain_hashes(tokens: list[int], block_size: int) -> set[int]:
    out, parent = set(), None
    for i in range(len(tokens) // block_size):
        parent = hash_block_tokens(parent, tuple(tokens[i * block_size:(i + 1) * block_size]))
        out.add(parent)
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=12),
       k=st.integers(1, 5), block_size=st.sampled_from([1, 2, 4]),
       max_tokens=st.integers(1, 20))
def test_cache_integrity_after_accept_reject_rounds(tiny, prompt, k, block_size, max_tokens):
    plain = build(tiny, None, block_size=block_size)
    spec = build(tiny, k, block_size=block_size)
    want = generate(plain, {"r": prompt}, max_tokens)["r"]
    got = generate(spec, {"r": prompt}, max_tokens)["r"]
    assert got == want
    valid = chain_hashes(prompt + got, block_size)
    for eng_kv in (spec.kv_cache_manager, spec.speculator.proposer.kv):
        pool = eng_kv.block_pool
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        assert pool.num_free_blocks == pool.num_blocks
        for h, block in pool.cached_block_hash_to_block.items():
            assert h in valid, "a cached block holds tokens that were never verified"
            assert block.block_hash == h
    # The target cached exactly what a run without speculation cached.
    assert (set(spec.kv_cache_manager.block_pool.cached_block_hash_to_block)
            == set(plain.kv_cache_manager.block_pool.cached_block_hash_to_block))


def test_mismatched_vocabularies_are_refused_with_both_sizes(tiny):
    target, _, _ = tiny
    mc = load_model_config(target)
    import dataclasses

    other = dataclasses.replace(mc, vocab_size=320)
    with pytest.raises(ModelLoadError, match="320.*256"):
        check_vocab(mc, other, "tiny-target", "tiny-draft")


def test_adaptive_switches_a_useless_draft_off(tiny, plain_outputs):
    eng = build(tiny, 4, adaptive=True)
    got = generate(eng, {"p17": PROMPTS["p17"]}, max_tokens=60)["p17"]
    ctrl = eng.speculator.controller
    assert got == generate(build(tiny, None), {"p17": PROMPTS["p17"]}, max_tokens=60)["p17"]
    stats = eng.get_stats().spec
    # With random models almost nothing is accepted: drafting stops after a few rounds and
    # only periodic probes (k = 1) run.
    assert stats.num_verify_steps < 30
    assert ctrl.t_plain is not None


def truncated_draft(model, num_layers: int):
    """A deliberately weak draft that shares the target's weights: its first ``num_layers``
    decoder layers, then the final norm and LM head."""
    import copy

    from torch import nn

    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = nn.ModuleList(list(model.model.layers)[:num_layers])
    draft.model = inner
    return draft


def test_smollm2_with_a_weak_draft_equals_plain_greedy(smollm2_engine):
    _weak_draft_equals_plain_greedy(smollm2_engine)


@pytest.fixture(scope="module")
def smollm2_native(smollm2_gguf, cache_dir):
    """SmolLM2 in its own format (Q4_1 / Q8_0), fp32 activations: on CPU the exact C++ int4 /
    int8 kernels (bf16 activations: ``test_smollm2_bf16_with_a_weak_draft_equals_plain_greedy``)."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", dtype=torch.float32,
                          quant=QuantConfig(scheme="native"),
                          scheduler=SchedulerConfig(max_model_len=2048))
    return LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)


def test_smollm2_native_with_a_weak_draft_equals_plain_greedy(smollm2_native):
    # verification rows go through the quantized kernels' M-row path: batch invariance of
    # the kernels is what keeps the drafted output equal to plain greedy
    _weak_draft_equals_plain_greedy(smollm2_native)


@pytest.fixture(scope="module", params=["none", "native"])
def smollm2_bf16(request, smollm2_gguf, cache_dir):
    """SmolLM2 with bf16 activations (the CPU default where the CPU has native bf16), in the
    ``none`` format (bf16 weights: every layer through the float linear method) and in its own
    format (Q4_1 / Q8_0 layers, float norms)."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", dtype=torch.bfloat16,
                          quant=QuantConfig(scheme=request.param),
                          scheduler=SchedulerConfig(max_model_len=2048))
    return LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)


def test_smollm2_bf16_with_a_weak_draft_equals_plain_greedy(smollm2_bf16):
    # verification rows in bf16: the float layers' C++ matmul (and the quantized kernels) sum
    # each row as the decode step does, so the drafted output equals plain greedy
    assert smollm2_bf16.runner.model.model.norm.weight.dtype == torch.bfloat16
    _weak_draft_equals_plain_greedy(smollm2_bf16)


@pytest.fixture(scope="module")
def smollm2_bf16_native(smollm2_gguf, cache_dir):
    """SmolLM2 in its own format (Q4_1 / Q8_0) with bf16 activations: its int4 layers take the
    W4A8 kernels. Its own engine, not ``smollm2_bf16``'s: prefix-cached KV blocks computed
    with the AMX kernel would otherwise feed the VNNI runs of the tests sharing it."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", dtype=torch.bfloat16,
                          quant=QuantConfig(scheme="native"),
                          scheduler=SchedulerConfig(max_model_len=2048))
    return LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)


def test_smollm2_amx_decode_with_a_weak_draft_equals_plain_greedy(smollm2_bf16_native,
                                                                   monkeypatch):
    # LOCALCHAT_CPU_AMX_DECODE=1: every int4 row (decode and verification) on the AMX-INT8
    # tile kernel, whose own summation order is batch invariant too (on a CPU without
    # AMX-INT8 the switch is a no-op and this repeats the VNNI run)
    from localchat.kernels import cpu

    monkeypatch.setenv(cpu.amx.AMX_DECODE_ENV, "1")
    assert (cpu.int4_a8_isa() == cpu.AMX_INT8_LEVEL) == cpu.has_amx_int8()
    _weak_draft_equals_plain_greedy(smollm2_bf16_native)


def test_smollm2_native_a8_with_a_weak_draft_equals_plain_greedy(smollm2_native):
    # fp32 activations through the integer-dot kernels (the engine's mode where the CPU lacks
    # native bf16): plain decoding and verification both pick tokens through the output
    # layer's one-pass greedy head (layers/greedy_head.py), row by row
    from localchat.engine.layers import greedy_head

    assert greedy_head.has_bound(smollm2_native.runner.model.model.embed_tokens)
    smollm2_native.a8_fp32 = True
    try:
        _weak_draft_equals_plain_greedy(smollm2_native, a8=True)
    finally:
        smollm2_native.a8_fp32 = False


def _weak_draft_equals_plain_greedy(base, a8: bool = False):
    from localchat.engine.kv_cache import allocate_kv_caches
    from localchat.engine.spec_decode.adaptive import AdaptiveDraftLength
    from localchat.engine.spec_decode.proposer import DraftModelProposer

    from ..kv_cache.test_prefix_caching_model import variant

    eng = variant(base, block_size=16)
    eng.a8_fp32 = a8 or eng.a8_fp32
    mc = base.model_config
    n_layers = 6
    dtype = base.runner.model.model.norm.weight.dtype
    caches = allocate_kv_caches(n_layers, 64, 16, mc.num_kv_heads, mc.head_dim,
                                dtype, torch.device("cpu"))
    proposer = DraftModelProposer(truncated_draft(base.runner.model, n_layers), caches, 64, 16,
                                  torch.device("cpu"))
    eng.speculator = Speculator(proposer, AdaptiveDraftLength(3, adaptive=False),
                                eng.max_model_len)
    tok = base.tokenizer
    prompts = {q: tok.apply_chat_template([{"role": "user", "content": q}])
               for q in ["List three fruits.", "What is 7 times 8?"]}
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    # the reference computes its prompts afresh, as eng does: a prompt tail computed over
    # another test's cached prefix differs in the last fp32 bits of attention, which decoding
    # through the integer-dot kernels can turn into another token
    base.reset_prefix_cache()
    for ids in prompts.values():
        *_, want = base.generate(ids, sp)
        *_, got = eng.generate(ids, sp)
        assert got.output_token_ids == want.output_token_ids
        assert got.text == want.text
    stats = eng.get_stats().spec
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_token_budget_cuts_drafts_short_and_stays_exact(tiny, plain_outputs):
    # A budget of 6 tokens for up to 4 requests: drafts are trimmed to what fits.
    eng = build(tiny, 7, draft="target", budget=6)
    assert generate(eng, PROMPTS) == plain_outputs
    assert eng.get_stats().spec.num_draft_tokens > 0


def test_sampling_with_drafts_is_seeded_and_complete(tiny):
    eng = build(tiny, 3, draft="target", budget=6)

    def alone():
        return {rid: generate(eng, {rid: ids}, temperature=0.8, seed=11)[rid]
                for rid, ids in PROMPTS.items()}

    # A seed reproduces a speculative run (the second run also reuses the prefix cache). In a
    # batch the draws depend on how many drafts the shared budget lets through each step.
    out1 = alone()
    assert alone() == out1
    assert all(len(v) == 24 for v in out1.values())
    stats = eng.get_stats().spec
    # The target drafting for itself: q == p, so every draft is accepted.
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0

