"""Request edges of ``localchat serve``'s app, in process (FastAPI's ``TestClient``) over
``ScriptedEngine`` (``scripted.py``). Each test pins a defect a tester found: lone surrogates
and hostile JSON were 500s, 500s were not counted in ``/metrics``, ``temperature`` was bounded
by OpenAI's 2 and not the engine's 100, the context error named the other route's field,
streamed ``text_offset`` restarted at 0 in every chunk, 17 stop sequences got "should be a
valid string", a user message with ``null`` content was accepted.
"""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

from localchat.engine.errors import ContextLengthError
from localchat.engine.sampling_params import SamplingParams
from tests.app.server.scripted import (
    CHAT,
    COMP,
    USER,
    ScriptedEngine,
    assert_error,
    make_app,
    metric,
    post,
)

# -- 1. lone surrogates -----------------------------------------------------------------------


def test_the_tokenizer_refuses_a_lone_surrogate(tokenizer):
    """Why the server must check: the tokenizer raises TypeError (it was a 500)."""
    with pytest.raises(TypeError):
        tokenizer.encode("\ud800")


@pytest.mark.parametrize("path,raw,param", [
    (CHAT, b'{"messages":[{"role":"user","content":"\\ud800"}],"max_tokens":2}',
     "messages.0.content"),
    (CHAT, b'{"messages":[{"role":"user","content":"ok \\udfff end"}]}', "messages.0.content"),
    (CHAT, b'{"messages":[{"role":"user","content":[{"type":"text","text":"\\ud800"}]}]}',
     "messages.0.content.0.text"),
    (CHAT, b'{"messages":[{"role":"user","content":"hi"}],"stop":["a","\\ud800"]}', "stop.1"),
    # Raw UTF-8-style bytes of a surrogate: json.loads decodes bytes with surrogatepass.
    (CHAT, b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}', "messages.0.content"),
    (COMP, b'{"prompt":"\\ud800"}', "prompt"),
    (COMP, b'{"prompt":["\\ud800"],"max_tokens":2}', "prompt.0"),
    (COMP, b'{"prompt":"hi","user":"\\ud800"}', "user"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(client, path, raw, param):
    err = assert_error(post(client, path, raw), 400, param, "invalid_value")
    assert "surrogate" in err["message"] and param in err["message"]


def test_a_lone_surrogate_in_a_field_name_is_a_400(client):
    err = assert_error(post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],'
                            b'"\\ud800x":1}'), 400, "\\ud800x", "invalid_value")
    assert "surrogate" in err["message"]


def test_a_surrogate_pair_is_text(client):
    """``"\\ud83d\\ude00"`` is one character (an emoji), not an error."""
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"\\ud83d\\ude00"}],'
                           b'"max_tokens":2}')
    assert r.status_code == 200, r.text
    r = post(client, COMP, b'{"prompt":"\\ud83d\\ude00","max_tokens":2}')
    assert r.status_code == 200, r.text


# -- 2. no body makes a 500 -------------------------------------------------------------------

HOSTILE = {
    "deep-array": b"[" * 100000 + b"]" * 100000,
    "deep-object-value": b'{"messages":' + b"[" * 100000 + b"]" * 100000 + b"}",
    "deep-ignored-field": b'{"messages":[{"role":"user","content":"hi"}],"prediction":{"a":'
                          + b"[" * 100000 + b"]" * 100000 + b"}}",
    "int-over-digit-limit": b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":'
                            + b"1" * 5000 + b"}",
    "nul": b"\x00",
    "utf16-garbage": b"\xff\xfe\x00\xd8",
    "lone-high-byte": b'{"prompt":"\xff"}',
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_json_is_a_400(client, name):
    for path in (CHAT, COMP):
        err = assert_error(post(client, path, HOSTILE[name]), 400, None)
        assert err["code"] == "invalid_json", (path, err)
        assert "Traceback" not in err["message"] and "set_int_max_str_digits" not in \
            err["message"]


@pytest.mark.parametrize("raw", [
    b'\xef\xbb\xbf{"prompt":"hi","max_tokens":2}', b'{"prompt":"hi","max_tokens":2}\x00',
    b'{"prompt":"hi","max_tokens":1e999}', b'{"prompt":"hi","max_tokens":-0}',
    b'{"prompt":"hi","logit_bias":{"1":NaN}}', b'{"prompt":{"a":[]}}', b'{"prompt":[[1]]}',
    b'{"messages":[{"role":"user","content":[{"type":"text"}]}]}', b'{"": 1}',
    b'{"messages":[{"role":"user","content":"hi"}],"metadata":{"a":"\\u0000"}}',
    "{\"prompt\":\"hi\"}".encode("utf-16"), "{\"prompt\":\"hi\"}".encode("utf-32"),
])
def test_odd_bodies_are_never_a_500(client, raw):
    for path in (CHAT, COMP):
        r = post(client, path, raw)
        assert r.status_code in (200, 400), (path, raw, r.text)
        if r.status_code == 400:
            assert_error(r, 400, r.json()["error"]["param"])


def test_moderately_deep_json_is_validated_not_a_500(client):
    """Nesting the parser accepts (a few hundred levels) reaches validation: an ignored
    ``dict[str, Any]`` field takes it, a typed field names the field."""
    deep = b"[" * 500 + b"]" * 500
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,'
                           b'"prediction":{"a":' + deep + b"}}")
    assert r.status_code == 200, r.text
    assert_error(post(client, CHAT, b'{"messages":' + deep + b"}"), 400, "messages.0")


# -- 3. 500s are counted --------------------------------------------------------------------


class Exploding:
    """A tokenizer whose chat template raises an unexpected exception (a bug: a 500)."""

    vocab_size = 100

    def apply_chat_template(self, messages, add_generation_prompt=True):
        raise RuntimeError("boom")

    def encode(self, text, add_special_tokens=False):
        raise KeyError("boom")


def test_unexpected_exceptions_are_counted_as_500(tokenizer):
    engine = ScriptedEngine(tokenizer)
    engine.tokenizer = Exploding()
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        name = 'localchat_requests_total{route="%s",status="500"}'
        assert metric(c, name % CHAT) is None
        for _ in range(2):
            err = assert_error(post(c, CHAT, {"messages": USER}), 500, None)
            assert err["type"] == "server_error" and "boom" not in err["message"]
        assert_error(post(c, COMP, {"prompt": "hi"}), 500, None)
        assert metric(c, name % CHAT) == 2
        assert metric(c, name % COMP) == 1


def test_every_status_is_counted(client):
    post(client, CHAT, {"messages": USER, "max_tokens": 2})
    post(client, CHAT, b"{")
    client.get("/v1/nope")
    name = 'localchat_requests_total{route="%s",status="%d"}'
    assert metric(client, name % (CHAT, 200)) == 1
    assert metric(client, name % (CHAT, 400)) == 1
    assert metric(client, name % ("other", 404)) == 1


# -- 4. temperature: the engine's range ----------------------------------------------------


def test_the_engine_bounds_temperature_at_100():
    """The reference the server follows: SamplingParams' own range [0, 100]."""
    SamplingParams(temperature=100.0)
    for bad in (math.nextafter(100.0, math.inf), -1e-9, math.nan, math.inf):
        with pytest.raises(ValueError):
            SamplingParams(temperature=bad)


@pytest.mark.parametrize("temperature", [0, 0.0, 2.5, 7, 100, 100.0])
def test_temperature_in_the_engines_range_is_accepted(client, engine, temperature):
    r = post(client, CHAT, {"messages": USER, "max_tokens": 2, "temperature": temperature})
    assert r.status_code == 200, r.text
    assert engine.params[-1].temperature == temperature
    r = post(client, COMP, {"prompt": "hi", "max_tokens": 2, "temperature": temperature})
    assert r.status_code == 200, r.text
    assert engine.params[-1].temperature == temperature


@pytest.mark.parametrize("raw", [repr(math.nextafter(100.0, math.inf)), "101", "-0.5",
                                 "-1e-9", "NaN", "Infinity", "-Infinity", "1e400"])
def test_temperature_outside_the_engines_range_is_refused(client, engine, raw):
    for path, head in ((CHAT, b'{"messages":[{"role":"user","content":"hi"}],'),
                       (COMP, b'{"prompt":"hi",')):
        r = post(client, path, head + b'"temperature":' + raw.encode() + b"}")
        assert_error(r, 400, "temperature", "invalid_value")
    assert engine.params == []


@pytest.mark.parametrize("raw", [b"2147483648", b"99999999999999999999"])
def test_a_top_k_past_the_bound_is_refused_before_the_engine(client, engine, raw):
    """A 20-digit ``top_k`` reached the engine and crashed its step, ending every request
    in it (a new-user trial); now a 400 names the field and the engine sees nothing."""
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],"top_k":' + raw + b"}")
    assert_error(r, 400, "top_k")
    assert engine.params == []


def test_top_k_minus_one_means_every_token(client, engine):
    """vLLM's clients send ``top_k: -1`` for "off" (a trial got a 400); it is the engine's
    0, every token. Below -1 is refused."""
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],"top_k":-1}')
    assert r.status_code == 200 and engine.params[-1].top_k == 0
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],"top_k":-2}')
    assert_error(r, 400, "top_k")


def test_other_floats_must_be_finite(client):
    r = post(client, CHAT, b'{"messages":[{"role":"user","content":"hi"}],"top_p":NaN}')
    assert_error(r, 400, "top_p")


# -- 6. the context error names the request's own field ----------------------------------------


def test_context_length_error_names_the_prompt_field(tokenizer):
    engine = ScriptedEngine(tokenizer, max_model_len=64)
    long_text = "word " * 200
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        for extra in ({}, {"max_tokens": 4}, {"max_completion_tokens": 4}):
            r = post(c, CHAT, {"messages": [{"role": "user", "content": long_text}], **extra})
            assert_error(r, 400, "messages", "context_length_exceeded")
        for extra in ({}, {"max_tokens": 4}):
            r = post(c, COMP, {"prompt": long_text, **extra})
            assert_error(r, 400, "prompt", "context_length_exceeded")
        r = post(c, COMP, {"prompt": list(range(1, 70))})
        assert_error(r, 400, "prompt", "context_length_exceeded")


def test_an_engine_context_error_names_the_prompt_field(tokenizer):
    engine = ScriptedEngine(tokenizer, fail=ContextLengthError("the prompt is too long"))
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        assert_error(post(c, CHAT, {"messages": USER}), 400, "messages",
                     "context_length_exceeded")
        assert_error(post(c, COMP, {"prompt": "hi"}), 400, "prompt", "context_length_exceeded")


# -- 7. streamed text_offset is cumulative ----------------------------------------------------


def sse_chunks(response):
    chunks = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.parametrize("top", [0, 2])
def test_streamed_text_offsets_are_cumulative(client, engine, top):
    body = {"prompt": "hi", "max_tokens": 8, "logprobs": top, "temperature": 0}
    whole = post(client, COMP, body).json()["choices"][0]
    streamed = sse_chunks(post(client, COMP, {**body, "stream": True}))
    logprobs = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert len(logprobs) == 8  # one token per chunk here
    tokens = [t for lp in logprobs for t in lp["tokens"]]
    offsets = [o for lp in logprobs for o in lp["text_offset"]]
    text = "".join(c["choices"][0]["text"] for c in streamed)
    # Independent reference: where each token starts in the completion's text.
    assert text == whole["text"] == "".join(tokens)
    expected = [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert offsets == expected == whole["logprobs"]["text_offset"]
    assert offsets[1] > 0 and len(set(offsets)) == len(offsets)
    assert tokens == whole["logprobs"]["tokens"]


# -- 9. stop: at most 16 -----------------------------------------------------------------------


def test_seventeen_stop_sequences_are_refused_as_too_many(client, engine):
    for path, base in ((CHAT, {"messages": USER}), (COMP, {"prompt": "hi"})):
        err = assert_error(post(client, path, {**base, "stop": [f"s{i}" for i in range(17)]}),
                           400, "stop", "invalid_value")
        assert "at most 16 stop sequences" in err["message"], err
        assert "valid string" not in err["message"]
        r = post(client, path, {**base, "max_tokens": 2, "stop": [f"s{i}" for i in range(16)]})
        assert r.status_code == 200, r.text
        assert engine.params[-1].stop == tuple(f"s{i}" for i in range(16))


@pytest.mark.parametrize("stop", [5, [5], ["a", None], {"a": 1}])
def test_a_stop_of_the_wrong_type_says_so(client, stop):
    err = assert_error(post(client, CHAT, {"messages": USER, "stop": stop}), 400, "stop")
    assert "a string or a list of strings" in err["message"], err


# -- 12. null content --------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_null_content_is_refused_unless_assistant(client, role):
    messages = [{"role": role, "content": None}, *USER]
    err = assert_error(post(client, CHAT, {"messages": messages}), 400,
                       "messages.0.content", "invalid_value")
    assert role in err["message"]
    messages = [{"role": role}, *USER]  # absent is null too
    assert_error(post(client, CHAT, {"messages": messages}), 400, "messages.0.content")


def test_assistant_content_may_be_null(client, engine):
    messages = [*USER, {"role": "assistant", "content": None}, *USER]
    r = post(client, CHAT, {"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = post(client, CHAT, {"messages": [*USER, {"role": "assistant"}, *USER], "max_tokens": 2})
    assert r.status_code == 200, r.text
