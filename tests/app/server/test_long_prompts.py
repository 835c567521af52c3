"""Oversized prompts, in process over ``ScriptedEngine``: a trial's four 3.9 MB prompts, each
rightly refused, froze a running stream for 8.7 s and ``/health`` for 5.2 s, since the routes
tokenized them whole on the event loop. Now a prompt far over the context is refused after
tokenizing a prefix of it (as ``ask`` refuses one), and tokenization runs in a worker thread;
the refusal keeps its status, shape and message form."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from tests.app.server.scripted import CHAT, COMP, ScriptedEngine, assert_error, make_app, post

CONTEXT = 64
PASTE = "word " * 100_000  # 500,000 characters, 100,000 tokens


class WatchedTokenizer:
    """SmolLM2's tokenizer, recording for each call the characters it was given to tokenize
    and whether it ran on an event loop's thread."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls: list[tuple[int, bool]] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, text, add_special_tokens=False):
        self._record(len(text))
        return self._inner.encode(text, add_special_tokens=add_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self._record(sum(len(m["content"]) for m in messages))
        return self._inner.apply_chat_template(messages, add_generation_prompt)

    def _record(self, chars: int) -> None:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        self.calls.append((chars, on_loop))


@pytest.fixture
def watched(tokenizer):
    return WatchedTokenizer(tokenizer)


@pytest.fixture
def small(watched):
    """A ``TestClient`` over a 64-token context, its engine and tokenizer's calls cleared."""
    engine = ScriptedEngine(watched, max_model_len=CONTEXT)
    watched.calls.clear()
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        yield c, engine


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"messages": [{"role": "user", "content": PASTE}]}, "messages"),
    (CHAT, {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": PASTE}]}, "messages"),
    (COMP, {"prompt": PASTE}, "prompt"),
    (COMP, {"prompt": [PASTE]}, "prompt"),
])
def test_a_far_too_long_prompt_is_refused_on_a_prefix(small, watched, tokenizer, path, body,
                                                      param):
    c, engine = small
    err = assert_error(post(c, path, body), 400, param, "context_length_exceeded")
    # The cost is bounded by the context: at most 8 characters per token of it (+ margin).
    assert watched.calls and max(chars for chars, _ in watched.calls) <= 8 * (CONTEXT + 16)
    assert engine.params == []
    words = err["message"].split()
    at_least, about = int(words[5]), int(words[8])
    assert err["message"] == (f"the prompt is more than {at_least} tokens (about {about} in "
                              f"all, measured on a prefix) but the context holds {CONTEXT} "
                              "tokens (prompt + reply)")
    whole = len(tokenizer.encode(PASTE))
    assert CONTEXT <= at_least < whole and whole / 2 < about < whole * 2


def test_a_prompt_measured_whole_keeps_its_exact_count(small, tokenizer):
    c, _ = small
    text = "word " * 100  # over the context, under the prefix rule's length
    err = assert_error(post(c, COMP, {"prompt": text}), 400, "prompt", "context_length_exceeded")
    n = len(tokenizer.encode(text, add_special_tokens=True))
    assert err["message"] == (f"the prompt is {n} tokens but the context holds {CONTEXT} "
                              "tokens (prompt + reply)")


@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    (COMP, {"prompt": "hi", "max_tokens": 2}),
    (CHAT, {"messages": [{"role": "user", "content": PASTE}]}),
    (COMP, {"prompt": PASTE}),
])
def test_prompts_are_tokenized_off_the_event_loop(small, watched, path, body):
    c, _ = small
    post(c, path, body)
    assert watched.calls and not any(on_loop for _, on_loop in watched.calls)
