"""Two defects a new-user trial found, in process over ``ScriptedEngine``: a bad token-id
``prompt`` on ``/v1/completions`` got "Input should be a valid string" (now the message names
the problem and what is accepted), and a ``max_tokens`` above the context got a 400 although
the README said it is capped (now it is capped: to the server's limit and to the room the
prompt leaves, the reply ending with ``finish_reason`` ``length``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.app.server.scripted import CHAT, COMP, USER, ScriptedEngine, assert_error, make_app, post

ACCEPTED = "a string, a one-string array, or a non-empty array of token ids"

# -- token-id prompts ---------------------------------------------------------------------


@pytest.mark.parametrize("prompt,problem", [
    ([], "is an empty array"),
    ([-1], "holds the negative token id -1 (item 0)"),
    ([5, 7, -3], "holds the negative token id -3 (item 2)"),
    ([1, "a"], "mixes types: item 1 is a string in an array of token ids"),
    ([1, 2.5], "mixes types: item 1 is a number with a fraction"),
    ([1, True], "mixes types: item 1 is a boolean"),
    ([1, None], "mixes types: item 1 is null"),
    (["a", "b"], "holds 2 strings"),
    (7, "is an integer"),
    ({"text": "hi"}, "is an object"),
])
def test_a_bad_prompt_names_the_problem_and_the_accepted_forms(tokenizer, prompt, problem):
    engine = ScriptedEngine(tokenizer)
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        err = assert_error(post(c, COMP, {"prompt": prompt, "max_tokens": 2}), 400, "prompt",
                           "invalid_value")
    assert err["message"].startswith(f"'prompt' {problem}"), err["message"]
    assert ACCEPTED in err["message"] and "valid string" not in err["message"]
    assert engine.params == []  # refused before generation


def test_an_id_past_the_vocabulary_names_its_size(tokenizer):
    vocab = tokenizer.vocab_size
    with TestClient(make_app(ScriptedEngine(tokenizer)), raise_server_exceptions=False) as c:
        err = assert_error(post(c, COMP, {"prompt": [1, vocab]}), 400, "prompt",
                           "invalid_value")
    assert err["message"] == f"token id {vocab} is outside the vocabulary (size {vocab})"


def test_good_prompts_still_pass(tokenizer):
    engine = ScriptedEngine(tokenizer)
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        for prompt in ([1, 2, 3], [0], [tokenizer.vocab_size - 1], "hi", ["hi"]):
            r = post(c, COMP, {"prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200, (prompt, r.text)
            assert r.json()["usage"]["prompt_tokens"] == (
                len(prompt) if isinstance(prompt[0], int) else len(tokenizer.encode("hi")))


# -- max_tokens over the context ------------------------------------------------------------


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_over_the_context_is_capped_to_the_room_left(tokenizer, field):
    engine = ScriptedEngine(tokenizer, max_model_len=64)
    prompt_len = len(tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True))
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        for asked in (100000, 10**9, 65):
            r = post(c, CHAT, {"messages": USER, field: asked})
            assert r.status_code == 200, r.text
            assert engine.params[-1].max_tokens == 64 - prompt_len
        r = post(c, CHAT, {"messages": USER, field: 3})  # within the room: as asked
        assert r.status_code == 200 and engine.params[-1].max_tokens == 3
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 3


def test_completions_max_tokens_capped_and_the_server_limit_caps_too(tokenizer):
    engine = ScriptedEngine(tokenizer, max_model_len=64)
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        assert post(c, COMP, {"prompt": list(range(1, 11)), "max_tokens": 100000}
                    ).status_code == 200
        assert engine.params[-1].max_tokens == 64 - 10
    with TestClient(make_app(engine, max_tokens_limit=20), raise_server_exceptions=False) as c:
        assert post(c, COMP, {"prompt": [1, 2], "max_tokens": 100000}).status_code == 200
        assert engine.params[-1].max_tokens == 20
        assert post(c, COMP, {"prompt": [1, 2], "max_tokens": 7}).status_code == 200
        assert engine.params[-1].max_tokens == 7
        assert post(c, COMP, {"prompt": [1, 2]}).status_code == 200  # OpenAI's default 16
        assert engine.params[-1].max_tokens == 16


def test_a_prompt_that_fills_the_context_is_still_refused(tokenizer):
    with TestClient(make_app(ScriptedEngine(tokenizer, max_model_len=64)),
                    raise_server_exceptions=False) as c:
        err = assert_error(post(c, COMP, {"prompt": list(range(1, 65)), "max_tokens": 1}),
                           400, "prompt", "context_length_exceeded")
    assert "64" in err["message"]
