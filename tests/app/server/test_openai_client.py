"""The official ``openai`` client against ``localchat serve``'s routes on 127.0.0.1.

Reference: a separately loaded synchronous ``LLMEngine`` on the same weights (the session's
``smollm2_engine``, fp32): greedy replies through HTTP must equal its output token for token
(text, counts, finish reason); a seeded sampled reply must equal its reply at the same seed.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from localchat.engine.sampling_params import SamplingParams
from tests.app.server.conftest import MODEL_ID


@pytest.fixture(scope="module")
def client(live_server):
    with openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def reference(engine, messages, **knobs):
    """The sync engine's last ``RequestOutput`` for ``messages`` (chat template rendered)."""
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    last = None
    for last in engine.generate(ids, SamplingParams(**knobs)):
        pass
    return ids, last


def test_models_lists_the_served_model(client, live_server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    health = httpx.get(live_server.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["max_model_len"] == 2048


def test_greedy_reply_equals_the_engine(client, smollm2_engine):
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ids, ref = reference(smollm2_engine, messages, temperature=0.0, max_tokens=24)
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0,
                                           max_tokens=24)
    choice = reply.choices[0]
    assert choice.message.content == ref.text
    assert choice.finish_reason == ref.finish_reason.value
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == ref.num_output_tokens
    assert reply.usage.total_tokens == len(ids) + ref.num_output_tokens
    assert reply.model == MODEL_ID and reply.object == "chat.completion"


def test_streamed_reply_equals_the_engine_and_reports_usage(client, smollm2_engine):
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is the boiling point of water?"}]
    ids, ref = reference(smollm2_engine, messages, temperature=0.0, max_tokens=20)
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=messages, temperature=0, max_completion_tokens=20,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == ref.text
    assert [r for r in reasons if r] == [ref.finish_reason.value] and reasons[-1] is not None
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), ref.num_output_tokens)


def test_second_turn_reuses_the_cached_prefix(client, async_engine):
    block = async_engine.engine.kv_cache_manager.block_size
    turn1 = [{"role": "user", "content": "Tell me one fact about the moon, in one sentence."}]
    first = client.chat.completions.create(model=MODEL_ID, messages=turn1, temperature=0,
                                           max_tokens=40)
    answer = first.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "And one about Mars?"}]
    second = client.chat.completions.create(model=MODEL_ID, messages=turn2, temperature=0,
                                            max_tokens=8)
    tok = async_engine.tokenizer
    ids1 = tok.apply_chat_template(turn1, add_generation_prompt=True)
    ids2 = tok.apply_chat_template(turn2, add_generation_prompt=True)
    assert second.usage.prompt_tokens == len(ids2)
    # Turn 1 computed K/V for its prompt and its reply's tokens but the last; the full blocks
    # of that (as far as turn 2's prompt agrees with it) are what turn 2 can reuse.
    reply_ids = tok.encode(answer)
    computed = ids1 + reply_ids
    common = 0
    while common < min(len(computed), len(ids2)) and computed[common] == ids2[common]:
        common += 1
    common = min(common, len(ids1) + first.usage.completion_tokens - 1, len(ids2) - 1)
    expected = common // block * block
    assert expected >= len(ids1) // block * block > 0
    assert second.usage.prompt_tokens_details.cached_tokens == expected


def test_stop_string_cuts_the_reply(client, smollm2_engine):
    messages = [{"role": "user", "content": "Count from one to ten in words."}]
    _, ref = reference(smollm2_engine, messages, temperature=0.0, max_tokens=32)
    words = ref.text.split()
    assert len(words) >= 4, ref.text
    stop = " " + words[3]
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0,
                                           max_tokens=32, stop=[stop])
    assert reply.choices[0].message.content == ref.text.split(stop)[0]
    assert reply.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_reproducible(client, smollm2_engine):
    messages = [{"role": "user", "content": "Write a short line about the sea."}]
    _, ref = reference(smollm2_engine, messages, temperature=1.0, seed=1234, max_tokens=16)
    replies = [client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=1,
                                              seed=1234, max_tokens=16)
               .choices[0].message.content for _ in range(2)]
    assert replies == [ref.text, ref.text]


def test_completions_route_equals_the_engine(client, smollm2_engine):
    prompt = "The three primary colours are"
    ids = smollm2_engine.tokenizer.encode(prompt, add_special_tokens=True)
    last = None
    for last in smollm2_engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=12)):
        pass
    reply = client.completions.create(model=MODEL_ID, prompt=prompt, temperature=0,
                                      max_tokens=12)
    assert reply.choices[0].text == last.text
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == last.num_output_tokens


def test_logprobs_of_a_greedy_reply(client, smollm2_engine):
    messages = [{"role": "user", "content": "Say hello."}]
    _, ref = reference(smollm2_engine, messages, temperature=0.0, max_tokens=8, logprobs=3)
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0,
                                           max_tokens=8, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == ref.num_output_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob <= 0.0
    text = "".join(e.token for e in content)
    assert text.startswith(reply.choices[0].message.content)


def test_metrics_count_requests_and_tokens(client, live_server):
    client.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=4,
                                   messages=[{"role": "user", "content": "Hi there."}])
    text = httpx.get(live_server.url + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    assert values['localchat_requests_total{route="/v1/chat/completions",status="200"}'] >= 1
    assert values["localchat_generation_tokens_total"] >= 4
    assert values["localchat_time_to_first_token_seconds_count"] >= 1
    assert 0.0 <= values["localchat_kv_cache_usage_ratio"] <= 1.0
    assert values['localchat_time_to_first_token_seconds_bucket{le="+Inf"}'] == \
        values["localchat_time_to_first_token_seconds_count"]
