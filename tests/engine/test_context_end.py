"""A reply that runs to the end of a context that is not a whole number of KV blocks
(``--context 40`` with blocks of 16) on SmolLM2-135M: the pool holds the whole context, the
request finishes with ``length`` at exactly ``max_model_len`` tokens, and its tokens are the
first tokens of the same greedy reply in a large context. The pool used to be rounded down
(40 -> 32 slots) and the scheduler preempted the request forever at its 33rd token."""

from __future__ import annotations

import dataclasses

import pytest

from localchat.engine.config import CacheConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.memory.kv_pools import plan_kv_pools
from localchat.engine.sampling_params import SamplingParams


def _engine_with_context(base: LLMEngine, max_model_len: int) -> LLMEngine:
    config = dataclasses.replace(base.config, cache=CacheConfig(block_size=16),
                                 scheduler=SchedulerConfig(max_model_len=max_model_len))
    return LLMEngine(base.runner.model, base.model_config, base.tokenizer, config,
                     max_model_len)


def _run(eng: LLMEngine, ids: list[int], max_tokens: int, max_steps: int):
    eng.add_request("r", ids, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    for _ in range(max_steps):
        for out in eng.step():
            if out.finished:
                return out
    pytest.fail(f"no finish in {max_steps} steps (the scheduler is stuck)")


@pytest.mark.parametrize("context", [40, 41, 47])
def test_a_reply_reaches_the_end_of_a_context_of_partial_blocks(smollm2_engine, context):
    ids = smollm2_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count from one to fifty in words."}])
    eng = _engine_with_context(smollm2_engine, context)
    assert eng.max_model_len == context
    assert eng.num_blocks * 16 >= context > (eng.num_blocks - 1) * 16
    out = _run(eng, ids, max_tokens=200, max_steps=3 * context)
    assert out.finish_reason == "length"
    assert len(ids) + len(out.output_token_ids) == context
    # The same greedy tokens as in a context with room to spare.
    wide = _run(_engine_with_context(smollm2_engine, 256), ids,
                max_tokens=context - len(ids), max_steps=3 * context)
    assert out.output_token_ids == wide.output_token_ids


def test_the_cuda_pool_plan_rounds_the_wanted_tokens_up_to_whole_blocks():
    plan = plan_kv_pools(1 << 40, bytes_per_token=1024, activation_bytes=0,
                         wanted_tokens=100, block_size=16, min_tokens=100)
    assert plan.num_blocks == 7
