"""Prefix caching, continuous batching and preemption on SmolLM2-135M: each feature on gives
the same greedy tokens (fp32) as the plain path.

The reference for each test is the same model run without the feature: a second
``LLMEngine`` over the same weights with prefix caching off, each request run alone, or a pool
large enough that nothing is preempted.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from localchat.engine.config import CacheConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def variant(base: LLMEngine, **cache) -> LLMEngine:
    """A fresh engine (own KV pool and scheduler) over ``base``'s model and tokenizer."""
    config = dataclasses.replace(base.config, cache=CacheConfig(**cache))
    return LLMEngine(base.runner.model, base.model_config, base.tokenizer, config,
                     base.max_model_len)


def run_all(eng: LLMEngine, prompts: dict[str, list[int]], params=GREEDY) -> dict:
    """Add every prompt, step to the end; ``{request_id: (output ids, num_cached_tokens)}``."""
    for rid, ids in prompts.items():
        eng.add_request(rid, ids, params)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = (out.output_token_ids, out.num_cached_tokens)
    return done


def converse(eng: LLMEngine, turns: list[str]) -> tuple[list[list[int]], list[int]]:
    """A multi-turn chat; returns each reply's token ids and each turn's cached tokens."""
    messages: list[dict] = [{"role": "system", "content": "You are a concise assistant."}]
    replies, cached = [], []
    for i, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        ids = eng.tokenizer.apply_chat_template(messages)
        (out_ids, n_cached), = run_all(eng, {f"t{i}": ids}).values()
        replies.append(out_ids)
        cached.append(n_cached)
        reply_ids = [t for t in out_ids if t not in eng.tokenizer.stop_token_ids]
        messages.append({"role": "assistant", "content": eng.tokenizer.decode(reply_ids)})
    return replies, cached


@pytest.fixture(scope="module")
def engines(smollm2_engine):
    on = variant(smollm2_engine, block_size=16, enable_prefix_caching=True)
    off = variant(smollm2_engine, block_size=16, enable_prefix_caching=False)
    return on, off


def test_three_turns_identical_with_prefix_caching_on_and_off(engines):
    on, off = engines
    turns = ["Name a fruit.", "What color is it?", "Say it in French."]
    replies_on, cached_on = converse(on, turns)
    replies_off, cached_off = converse(off, turns)
    assert replies_on == replies_off
    assert cached_off == [0, 0, 0]
    # Turns 2 and 3 reuse the earlier turns: at least the previous turn's prompt, in blocks.
    assert cached_on[0] == 0 and cached_on[1] >= 16 and cached_on[2] > cached_on[1]
    assert on.kv_cache_manager.usage == 0.0
    stats = on.get_stats()
    assert stats.prefix_cache_hits == sum(cached_on) and 0 < stats.prefix_cache_hit_rate < 1


def test_four_concurrent_requests_equal_each_alone(engines):
    on, _ = engines
    on.reset_prefix_cache()
    tok = on.tokenizer
    # Two share a long system prompt (shared blocks within one step), two do not.
    sys_msg = {"role": "system", "content": "You answer questions about geography briefly. " * 4}
    prompts = {
        "a": tok.apply_chat_template([sys_msg, {"role": "user", "content": "Capital of Peru?"}]),
        "b": tok.apply_chat_template([sys_msg, {"role": "user", "content": "Longest river?"}]),
        "c": tok.apply_chat_template([{"role": "user", "content": "Count to five."}]),
        "d": tok.apply_chat_template([{"role": "user", "content": "Name two colors."}]),
    }
    alone = {}
    for rid, ids in prompts.items():
        on.reset_prefix_cache()
        alone.update(run_all(on, {rid: ids}))
    on.reset_prefix_cache()
    together = run_all(on, prompts)
    assert {k: v[0] for k, v in together.items()} == {k: v[0] for k, v in alone.items()}


def test_pool_that_forces_preemption_gives_the_same_tokens(smollm2_engine):
    tok = smollm2_engine.tokenizer
    prompts = {f"p{i}": tok.apply_chat_template([{"role": "user", "content": q}])
               for i, q in enumerate(["Why is the sky blue?", "What is a CPU?",
                                      "How do bees fly?"])}
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    big = run_all(variant(smollm2_engine, block_size=16), prompts, params)
    longest = max(len(ids) for ids in prompts.values()) + 24
    small = variant(smollm2_engine, block_size=16, num_blocks=-(-longest // 16) + 2)
    out = run_all(small, prompts, params)
    assert small.get_stats().num_preemptions > 0
    assert {k: v[0] for k, v in out.items()} == {k: v[0] for k, v in big.items()}
    assert small.kv_cache_manager.usage == 0.0


@pytest.fixture(scope="module")
def native_a8(smollm2_gguf, cache_dir):
    """SmolLM2 in its own format (Q4_1 / Q8_0) with fp32 activations, decoding through the
    integer-dot kernels as an automatically fp32 engine does on a CPU without native bf16
    (``LLMEngine.a8_fp32``, set here so that every CPU runs this mode)."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig

    config = EngineConfig(device="cpu", dtype=torch.float32, quant=QuantConfig(scheme="native"),
                          scheduler=SchedulerConfig(max_model_len=2048))
    base = LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)
    on = variant(base, block_size=16, enable_prefix_caching=True)
    off = variant(base, block_size=16, enable_prefix_caching=False)
    on.a8_fp32 = off.a8_fp32 = True
    return on, off


def test_a8_engine_computes_prompt_tails_on_the_exact_kernels(native_a8, monkeypatch):
    """The same question asked twice: the second time all but the prompt's last partial block
    comes from the prefix cache and 1-16 tokens are computed, a step of decode size. Those
    prompt rows take the exact kernels as a whole prompt does (``LLMEngine.step``,
    ``computes_prompt``), decode rows the integer-dot ones. Through the integer-dot kernels
    the tail made SmolLM2 answer "L'Étoile, la Marseillaise, ..." instead of "The capital of
    France is Paris." (its first tokens win by 4+ nats once the prompt is exact, so the
    answer is compared whole); the answer now equals the engine's without prefix caching."""
    from localchat import kernels

    on, off = native_a8
    steps = []  # (rows of prompt computed, integer-dot kernels on) per step
    execute = on.runner.execute_model

    def recording(sched, draft_probs=None):
        prompt = sum(n for r in sched.scheduled
                     if r.num_computed_tokens < r.num_prompt_tokens
                     for n in [sched.num_scheduled_tokens[r.request_id]])
        steps.append((prompt, kernels.cpu_a8_enabled(torch.float32)))
        return execute(sched, draft_probs)

    monkeypatch.setattr(on.runner, "execute_model", recording)
    tok = on.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=24)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    want = run_all(off, {"ref": ids}, params)["ref"]
    first = run_all(on, {"first": ids}, params)["first"]
    steps_first, steps[:] = list(steps), []
    second = run_all(on, {"second": ids}, params)["second"]
    assert first[1] == 0 and len(ids) - 16 <= second[1] < len(ids)  # 1-16 rows computed
    assert steps_first[0] == (len(ids), False) and steps[0] == (len(ids) - second[1], False)
    assert all(a8 for _, a8 in steps_first[1:] + steps[1:])  # the decode steps
    assert all(p == 0 for p, _ in steps_first[1:] + steps[1:])
    assert tok.decode(want[0]).startswith("The capital of France is Paris")
    assert first[0] == want[0] and second[0] == want[0], tok.decode(second[0])
