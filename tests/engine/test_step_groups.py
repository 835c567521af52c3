"""Greedy replies that arrive together are the bits each gets alone (CPU engine).

A trial sent the same greedy chat request to ``serve`` six times at once: four replies
differed from the request sent alone (SmolLM2, "Write a poem about a dog.", 16 tokens), on
the same warm prefix cache. Each request computed 3 prompt tokens after 32 cached ones; alone
those 3 rows take the batch-invariant row kernels (a step of at most ``CPU_MAX_ROWS`` rows),
together the step's 18 rows took the prompt GEMM over dequantized weights and SDPA. The
runner now splits a CPU step of more rows into forwards that each compute what its requests
would alone (``ModelRunner.step_groups``), and the scheduler never cuts a prompt chunk short
for another request's tokens. Reference: each request alone on the same engine and the same
prefix-cache state; compared bit for bit (tokens and log-probabilities).
"""

from __future__ import annotations

import pytest

from localchat.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, logprobs=0, ignore_eos=True)
TOPICS = ["a dog", "the sea", "a cat", "winter", "a city", "bread", "a robot", "the moon",
          "a river", "music", "a tree", "coffee", "rain", "a train", "chess", "snow",
          "a bird", "fire", "a clock", "the sun"]


@pytest.fixture(scope="module")
def engine(smollm2_gguf, cache_dir):
    return LLMEngine.from_path(smollm2_gguf, EngineConfig(
        device="cpu", scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=32)),
        cache_dir=cache_dir)


@pytest.fixture(scope="module")
def engine_no_prefix_cache(smollm2_gguf, cache_dir):
    """Every request computes its whole prompt: what together and alone share is only the
    batching."""
    return LLMEngine.from_path(smollm2_gguf, EngineConfig(
        device="cpu", scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=32),
        cache=CacheConfig(enable_prefix_caching=False)), cache_dir=cache_dir)


def _ids(engine, topic):
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a poem about {topic}."}],
        add_generation_prompt=True)


def _run_together(engine, prompts: dict[str, list[int]]) -> dict[str, list]:
    """(token id, logprob) pairs of each request, all added before the first step."""
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, GREEDY)
    got = {rid: [] for rid in prompts}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] += [(t, lp[t]) for t, lp in
                                    zip(out.new_token_ids, out.logprobs or [])]
    return got


def test_identical_requests_at_once_equal_one_alone(engine):
    """The trial's case: the same request six times at once on a warm prefix cache."""
    ids = _ids(engine, "a dog")
    engine.reset_prefix_cache()
    _run_together(engine, {"warm": ids})  # its full blocks are now cached
    alone = _run_together(engine, {"alone": ids})["alone"]
    together = _run_together(engine, {f"r{i}": ids for i in range(6)})
    for rid, got in together.items():
        assert got == alone, rid


def test_many_requests_equal_each_alone(engine_no_prefix_cache):
    """20 requests at once: their prompt steps (about 35 tokens each, above
    ``CPU_MAX_ROWS``) and their decode steps (20 rows) hold more rows than one row-kernel
    call; each reply equals that request alone."""
    engine = engine_no_prefix_cache
    prompts = {f"t{i}": _ids(engine, topic) for i, topic in enumerate(TOPICS)}
    alone = {}
    for rid, ids in prompts.items():
        alone.update(_run_together(engine, {rid: ids}))
    together = _run_together(engine, prompts)
    for rid in prompts:
        assert together[rid] == alone[rid], rid


def test_batch_invariance_off_batches_a_step_in_one_forward(smollm2_gguf, cache_dir,
                                                            monkeypatch):
    """``SchedulerConfig(batch_invariant=False)`` (``serve --no-batch-invariant``): the
    trial's six requests take one forward per step, as before the groups, and decode rows
    may share a step with prompt tokens; invariance on, the same step takes one forward per
    group."""
    ids = None
    forwards = {}
    for invariant in (True, False):
        engine = LLMEngine.from_path(smollm2_gguf, EngineConfig(
            device="cpu", scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=32,
                                                    batch_invariant=invariant),
            cache=CacheConfig(enable_prefix_caching=False)), cache_dir=cache_dir)
        assert engine.scheduler.separate_prompt_steps is invariant
        assert engine.runner.split_steps is invariant
        ids = ids or _ids(engine, "a dog")
        calls = []
        real = engine.runner._forward
        monkeypatch.setattr(engine.runner, "_forward",
                            lambda *a, calls=calls, real=real: calls.append(1) or real(*a))
        for i in range(6):
            engine.add_request(f"r{i}", ids, GREEDY)
        engine.step()  # six prompts of more than 16 tokens each
        forwards[invariant] = len(calls)
    # with invariance the long prompts run together in forward_groups, not through _forward
    assert forwards == {True: 0, False: 1}
