"""A greedy request's reply does not depend on what arrives while it decodes.

A trial through ``serve`` found a temperature-0 reply that changed when another client's
prompt arrived during it: the CPU engine computed that step's decode row together with the
new prompt's tokens, through the prompt's kernels (a GEMM over dequantized weights, SDPA)
instead of the row kernels it takes alone. The scheduler now gives decode rows and prompt
tokens separate steps on CPU (``Scheduler.schedule``). Reference: the same request alone, on
the same engine: its sampled tokens and their log-probabilities must be the same bits when a
second request's prompt arrives after its 3rd, 5th and 7th tokens. The engine runs the CPU
default for this model (native Q4_1 weights, the engine's automatic dtype).
"""

from __future__ import annotations

import pytest

from localchat.engine.config import EngineConfig, SchedulerConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams

A_PROMPT = "Write a python function that checks if a string is a palindrome."
B_PROMPT = ("Write a C function that reverses a singly linked list, and explain each step of "
            "it in a short paragraph for a beginner who has never used pointers before.")


@pytest.fixture(scope="module")
def engine(smollm2_gguf, cache_dir):
    return LLMEngine.from_path(smollm2_gguf, EngineConfig(
        device="cpu", scheduler=SchedulerConfig(max_model_len=1024)), cache_dir=cache_dir)


def _chat(engine, text):
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                add_generation_prompt=True)


def _run(engine, b_after: int | None):
    """A's (token id, logprob) pairs; B's prompt arrives after A's ``b_after``-th token."""
    greedy = SamplingParams(temperature=0, max_tokens=24, logprobs=0, ignore_eos=True)
    engine.reset_prefix_cache()  # every run computes both prompts in full
    engine.add_request("a", _chat(engine, A_PROMPT), greedy)
    got, b_added = [], False
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id != "a":
                continue
            got += [(t, lp[t]) for t, lp in zip(out.new_token_ids, out.logprobs or [])]
            if b_after is not None and not b_added and len(got) >= b_after:
                engine.add_request("b", _chat(engine, B_PROMPT),
                                   SamplingParams(temperature=0, max_tokens=4))
                b_added = True
    assert b_after is None or b_added
    return got


def test_a_greedy_reply_is_the_same_bits_whatever_arrives_meanwhile(engine):
    alone = _run(engine, None)
    assert len(alone) == 24
    for b_after in (3, 5, 7):
        assert _run(engine, b_after) == alone, f"B's prompt arrived after {b_after} tokens"
