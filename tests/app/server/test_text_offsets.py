"""The legacy ``text_offset`` of ``/v1/completions`` logprobs, in process over
``ScriptedEngine``: a trial got offsets that added up the lengths of token strings, U+FFFD
placeholders included (a 16-character emoji text: offsets up to 31; a text cut by a stop
string at 11 characters: an offset of 13). Each offset is now where the token's text starts
in the returned text: monotonic, never past its end, and the byte tokens of one character
all start where that character starts."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.app.server.scripted import COMP, ScriptedEngine, make_app, post

EMOJI = " 😀🎉🚀 ok 🙂👍"  # SmolLM2: 13 tokens, 10 of them parts of a character


def completion(client, body, stream):
    """``(text, tokens, text_offset)`` of a completion, whole or streamed."""
    if not stream:
        choice = post(client, COMP, body).json()["choices"][0]
        lp = choice["logprobs"]
        return choice["text"], lp["tokens"], lp["text_offset"]
    text, tokens, offsets = "", [], []
    for line in post(client, COMP, {**body, "stream": True}).text.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                offsets += choice["logprobs"]["text_offset"]
    return text, tokens, offsets


def reference(tokenizer, ids, text):
    """Where token i starts in ``text``: the characters its predecessors complete (a
    trailing U+FFFD of ``decode`` is an incomplete character), capped to ``text``."""
    return [min(len(tokenizer.decode(ids[:i]).rstrip("\ufffd")), len(text))
            for i in range(len(ids))]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("reply,stop,want", [
    (EMOJI, None, EMOJI),
    (" The quick brown fox jumps", "ck bro", " The qui"),
    (EMOJI, "ok", " 😀🎉🚀 "),
], ids=["emoji", "stop-mid-word", "stop-after-emoji"])
def test_text_offsets_are_positions_in_the_returned_text(tokenizer, stream, reply, stop,
                                                         want):
    engine = ScriptedEngine(tokenizer, reply=reply)
    body = {"prompt": "hi", "max_tokens": 32, "logprobs": 1, "stop": stop}
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        text, tokens, offsets = completion(c, body, stream)
    assert text == want
    ids = engine.reply_ids[: len(tokens)]
    assert offsets == reference(tokenizer, ids, text)
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)


def test_the_bytes_of_one_character_start_where_it_starts(tokenizer):
    engine = ScriptedEngine(tokenizer, reply=EMOJI)
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        text, tokens, offsets = completion(c, {"prompt": "hi", "max_tokens": 32,
                                               "logprobs": 0}, False)
    assert text == EMOJI and len(text) == 10 and tokens[1] == "\ufffd"
    # " " + 3 bytes of the first emoji, its last byte (it starts at 1), 2 + 1 + 1 bytes of
    # the second (at 2), 1 + 1 + 1 of the third (at 3), " ok" (4), " 🙂" (7), 1 + 1 + 1 (9).
    assert offsets == [0, 1, 2, 2, 2, 3, 3, 3, 4, 7, 9, 9, 9]
