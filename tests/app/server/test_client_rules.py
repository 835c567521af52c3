"""What ``ask`` does with what a server answers, whatever the server: a refused turn (4xx)
is taken back from the history so the conversation goes on; stop strings hold even when the
server ignores ``stop`` (the reply cut client-side where the earliest stop starts)."""

from __future__ import annotations

import json

import pytest

from tests.app.server.fake_openai import (
    QUESTION,
    ask,
    fake_openai,
    history,
    refusing_openai,
    stop_ignoring_openai,
)
from tests.app.server.live import ServerThread


def test_a_refused_turn_is_not_kept_and_the_conversation_goes_on(env):
    """A turn the server refuses (400) leaves no user message behind: kept, it would be merged
    into every later turn of the conversation and make each one fail the same way."""
    refusing = ServerThread(refusing_openai()).start()
    try:
        first = ask(env, "--endpoint", refusing.url, "--json", QUESTION)
        fine = ask(env, "--endpoint", refusing.url, "--json", "hello")  # refused too
    finally:
        refusing.stop()
    for proc in (first, fine):
        assert proc.returncode == 1
        err = proc.stderr.decode()
        assert "answered 400" in err and "9035 tokens" in err and "Traceback" not in err
    assert history(env) == []  # neither refused turn was kept (nor an empty conversation)
    app, seen = fake_openai()
    server = ServerThread(app).start()
    try:
        ok = ask(env, "--endpoint", server.url, "--json", QUESTION)
        again = ask(env, "--endpoint", server.url, "--json", "-c", "and of Italy?")
    finally:
        server.stop()
    assert ok.returncode == 0 and again.returncode == 0, again.stderr
    assert [m["role"] for m in seen[-1]["body"]["messages"]] == ["user", "assistant", "user"]
    assert history(env) == [("user", QUESTION), ("assistant", "Hello world"),
                            ("user", "and of Italy?"), ("assistant", "Hello world")]


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("pieces,stops", [
    (["Hello ST", "OPWO", "RD world", " and more"], ["STOPWORD"]),  # a stop across pieces
    (["a", "b", "c", "d"], ["bcd", "c"]),                            # the earliest start wins
    (["no stop ", "in this ", "reply"], ["zzz"]),                    # nothing cut
])
def test_stop_strings_hold_against_a_server_that_ignores_them(env, pieces, stops, whole):
    """``ask --stop`` never prints a stop string or what follows it, even when the server
    ignores ``stop`` (the README's promise): the reply is cut client-side exactly where the
    earliest stop starts (the reference: ``str.find``), and the finish reason says stop."""
    text = "".join(pieces)
    cut = min((text.find(x) for x in stops if x in text), default=len(text))
    server = ServerThread(stop_ignoring_openai(pieces, whole)).start()
    try:
        args = [a for x in stops for a in ("--stop", x)]
        proc = ask(env, "--endpoint", server.url, "--no-save", "--json", *args, QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert doc["content"] == text[:cut]
    assert doc["finish_reason"] == ("stop" if cut < len(text) else "length")
