"""The remote backend's edges, found by a user's audit of ``localchat serve`` and
``--endpoint``: a refused ``chat --jsonl`` turn, the model an endpoint answered with, a
server that ignores ``"stream"``, ``--local`` with ``--endpoint``, a partial reply before an
error, usage a server did not send, a key-protected server without a key, two servers in one
runtime folder, and ``config set api_key``."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.app.server.live import ServerThread
from tests.app.server.test_ask_backend import QUESTION, ask, fake_openai, history


def _jsonl(env, lines, *args):
    text = "".join(json.dumps(line) + "\n" for line in lines)
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", "chat", "--jsonl", *args],
                          input=text.encode(), capture_output=True, env=env, timeout=300,
                          check=False)


def test_chat_jsonl_reports_a_refused_turn_and_goes_on(env):
    app, seen = fake_openai()
    refusing = FastAPI()

    @refusing.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model"}]})

    @refusing.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if "too long" in body["messages"][-1]["content"]:
            return JSONResponse(status_code=400, content={"error": {
                "message": "the prompt is 9031 tokens; the context holds 8192",
                "type": "invalid_request_error", "param": "messages",
                "code": "context_length_exceeded"}})
        answer = next(r for r in app.routes if getattr(r, "path", "") == "/v1/chat/completions")
        return await answer.endpoint(request)

    server = ServerThread(refusing).start()
    try:
        proc = _jsonl(env, [{"role": "user", "content": "too long"},
                            {"role": "user", "content": "hi"}], "--endpoint", server.url)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    first, second = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert "9031" in first["error"] and "8192" in first["error"]
    assert second["content"] == "Hello world"
    # the refused turn is not part of the conversation sent next
    assert [m["content"] for m in seen[0]["body"]["messages"] if m["role"] != "system"] == \
        ["hi"]


def test_endpoint_without_a_model_records_the_model_that_answered(env):
    app, _ = fake_openai()
    server = ServerThread(app).start()
    try:
        proc = ask(env, "--endpoint", server.url, "--json", QUESTION)
        listed = subprocess.run([sys.executable, "-m", "localchat.app.cli", "history", "list"],
                                capture_output=True, env=env, timeout=120, check=False)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "fake-model"
    assert "fake-model" in listed.stdout.decode()
    assert "smollm2" not in listed.stdout.decode()


def test_a_server_that_ignores_stream_still_answers(env):
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "plain-model"}]})

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        return JSONResponse({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Paris."},
             "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}})

    server = ServerThread(app).start()
    try:
        proc = ask(env, "--endpoint", server.url, "--json", QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["content"] == "Paris." and doc["model"] == "plain-model"
    assert doc["usage"]["prompt_tokens"] == 7 and doc["finish_reason"] == "stop"


def test_local_and_endpoint_together_is_a_usage_error(env):
    proc = ask(env, "--local", "--endpoint", "http://127.0.0.1:9/v1", QUESTION)
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "--local" in lines[0] and "--endpoint" in lines[0], lines


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8088", "ftp://example.org",
                                 "http://[::1", "http://127.0.0.1:99999", "http://"])
def test_endpoint_that_is_not_an_http_url_is_a_usage_error(env, url):
    proc = ask(env, "--endpoint", url, QUESTION)
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and f"--endpoint {url}: not an http:// or https:// URL" in lines[0]


def test_partial_reply_ends_its_line_before_the_error_and_is_kept(env):
    app, _ = fake_openai(die_after=1)
    server = ServerThread(app).start()
    try:
        proc = ask(env, "--endpoint", server.url, QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 1
    assert proc.stdout == b"Hello\n"
    assert history(env) == [("user", QUESTION), ("assistant", "Hello")]


def test_stats_without_usage_say_unknown_not_zero():
    from localchat.app.report import answer_stats, format_stats_line
    from localchat.app.server.client import RemoteMetrics, _final

    metrics = RemoteMetrics(arrival_time=0.0, first_token_time=0.5, last_token_time=1.5)
    out = _final(["Hello", " world"], "stop", None, metrics)
    line = format_stats_line(answer_stats(out, 0, interrupted=False))
    assert "prompt ? tokens" in line and "reply ? tokens" in line
    assert " 0 tokens" not in line and "0.0 tok/s" not in line


def test_remote_decode_rate_follows_the_engines_definition():
    from localchat.app.server.client import RemoteMetrics, _final

    metrics = RemoteMetrics(arrival_time=0.0, first_token_time=0.25, last_token_time=2.25)
    assert metrics.decode_tokens_per_s is None  # no usage yet
    _final(["x"], "stop", {"prompt_tokens": 3, "completion_tokens": 9}, metrics)
    assert metrics.decode_tokens_per_s == pytest.approx((9 - 1) / 2.0)


def test_a_key_protected_server_without_a_key_says_why_it_is_not_used(monkeypatch, capsys):
    from localchat.app.server import backend, state

    info = state.ServerInfo(url="http://127.0.0.1:1", model="smollm2-135m", auth=True, pid=1)
    monkeypatch.setattr(state, "find_server", lambda model=None: info)

    class Settings:
        endpoint = None
        api_key = None

    assert backend.choose_backend("smollm2-135m", explicit_model=False, local=False,
                                  endpoint=None, settings=Settings()) is None
    err = capsys.readouterr().err
    assert "needs an API key" in err and "http://127.0.0.1:1" in err


def test_a_second_server_leaves_the_first_ones_state_file(env, monkeypatch):
    """A live server registered in the runtime folder (here a fake answering /health, under
    this test's pid) stays the one clients find when another ``serve`` starts there."""
    from localchat.app.server import state

    app, _ = fake_openai()
    first = ServerThread(app).start()
    try:
        monkeypatch.setenv("LOCALCHAT_HOME", env["LOCALCHAT_HOME"])
        state.write_state(state.ServerInfo(url=first.url, model="fake-model", pid=os.getpid()))
        path = state.state_path()
        before = path.read_text()
        serve = subprocess.Popen([sys.executable, "-m", "localchat.app.cli", "serve", "--port",
                                  "0"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 240
            err = b""
            while time.monotonic() < deadline and b"another localchat server" not in err:
                ready, _, _ = select.select([serve.stderr], [], [], 1.0)
                if ready:
                    chunk = os.read(serve.stderr.fileno(), 4096)
                    if not chunk:
                        break
                    err += chunk
            assert b"another localchat server" in err, err
            assert path.read_text() == before
        finally:
            serve.terminate()
            serve.wait(30)
        assert path.read_text() == before  # its exit did not remove the first one's file
    finally:
        first.stop()


def test_config_set_api_key_never_prints_the_key(env):
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "config", "set", "api_key",
                           "s3cr3tKEY"], capture_output=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"s3cr3tKEY" not in proc.stdout + proc.stderr
    assert b"api_key set" in proc.stderr
