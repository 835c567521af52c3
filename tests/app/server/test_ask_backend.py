"""``ask`` with a backend over HTTP: a fake OpenAI-compatible server on 127.0.0.1
(``--endpoint``), a running ``localchat serve`` found through its state file, and servers
that die mid-reply (``ask`` exits 1 with one line; the user's message stays in the history).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.app.server.fake_openai import QUESTION, ask, fake_openai, history
from tests.app.server.live import ServerThread, start_serve


def test_ask_against_a_fake_openai_server(env):
    app, seen = fake_openai()
    server = ServerThread(app).start()
    try:
        env = {**env, "LOCALCHAT_API_KEY": "k-123"}
        proc = ask(env, "--endpoint", server.url, "--json", "--temperature", "0",
                   "--max-tokens", "9", QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["content"] == "Hello world"
    assert doc["usage"] == {"prompt_tokens": 11, "cached_tokens": 3, "completion_tokens": 2}
    assert doc["finish_reason"] == "stop"
    (req,) = seen
    assert req["auth"] == "Bearer k-123"
    body = req["body"]
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["messages"][-1] == {"role": "user", "content": QUESTION}
    assert body["temperature"] == 0 and body["max_tokens"] == 9
    assert history(env) == [("user", QUESTION), ("assistant", "Hello world")]


@pytest.mark.parametrize(("card", "model_flag", "context"), [
    (None, (), None),  # OpenAI's API: /v1/models says no context size
    (4096, (), 4096),  # vLLM, localchat serve: max_model_len in the model's entry
    (4096, ("-m", "fake-model"), 4096),  # -m given: /v1/models is read for --json only
])
def test_endpoint_json_context_is_the_servers_and_memory_is_null(env, card, model_flag,
                                                                  context):
    app, _ = fake_openai(max_model_len=card)
    server = ServerThread(app).start()
    try:
        proc = ask(env, "--endpoint", server.url, *model_flag, "--json", "--no-save", QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"context", "memory", "sampling"} <= set(doc)  # the keys stay, for scripts
    assert doc["context"] == context
    assert doc["memory"] is None  # the server's memory: not measured by this client


def test_endpoint_dying_mid_reply_exits_1_and_keeps_the_question(env):
    app, _ = fake_openai(die_after=1)
    server = ServerThread(app).start()
    try:
        proc = ask({**env, "LOCALCHAT_ENDPOINT": server.url}, QUESTION)
    finally:
        server.stop()
    assert proc.returncode == 1
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), lines
    assert "mid-reply" in lines[0] or "closed the stream" in lines[0]
    assert "Traceback" not in proc.stderr.decode()
    assert history(env)[0] == ("user", QUESTION)


def test_local_server_dying_mid_reply_exits_1_and_keeps_the_question(env, monkeypatch):
    """The same through a server found by its state file (``http.client``, not httpx): the
    connection dropped after one chunk is one ``mid-reply`` line, exit 1, question kept."""
    from localchat.app.server import state

    app, seen = fake_openai(die_after=1)
    server = ServerThread(app).start()
    try:
        monkeypatch.setenv("LOCALCHAT_HOME", env["LOCALCHAT_HOME"])
        state.write_state(state.ServerInfo(url=server.url, model="fake-model"))
        proc = ask(env, "-m", "fake-model", QUESTION)
    finally:
        server.stop()
    assert len(seen) == 1  # the state file's server was used
    assert proc.returncode == 1
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), lines
    assert "mid-reply" in lines[0] or "closed the stream" in lines[0]
    assert history(env)[0] == ("user", QUESTION)


def test_stdlib_transport_errors_are_one_kind():
    """``StdlibTransport``: a refused connection is a connect ``TransportError``; a served
    body is read whole and as lines."""
    from localchat.app.server.transport import StdlibTransport, TransportError

    transport = StdlibTransport({}, 2.0, 2.0)
    with pytest.raises(TransportError) as info:
        transport.get("http://127.0.0.1:9/health")
    assert info.value.connect and str(info.value)
    app, _ = fake_openai()
    server = ServerThread(app).start()
    try:
        assert transport.get(server.url + "/health").json()["status"] == "ok"
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
        with transport.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == "Hello"
    finally:
        server.stop()


def test_unreachable_endpoint_is_one_line(env):
    proc = ask(env, "--endpoint", "http://127.0.0.1:9", QUESTION)
    assert proc.returncode == 1
    err = proc.stderr.decode().strip()
    assert err.count("\n") == 0 and err.startswith("localchat: error: cannot reach")


def test_ask_uses_a_running_server_through_its_state_file(env, live_server, smollm2_engine):
    """The state file points at the live server: ``ask`` answers from it (its request count
    grows), with the engine's greedy reply; ``ask -c`` reuses the cached prefix."""
    from localchat.app.server import state
    from localchat.engine.sampling_params import SamplingParams
    from tests.app.server.conftest import MODEL_ID

    old = os.environ.get("LOCALCHAT_HOME")
    os.environ["LOCALCHAT_HOME"] = env["LOCALCHAT_HOME"]
    try:
        state.write_state(state.ServerInfo(url=live_server.url, model=MODEL_ID))
        assert state.find_server(MODEL_ID) is not None
        assert state.find_server("some-other-model") is None
    finally:
        if old is None:
            del os.environ["LOCALCHAT_HOME"]
        else:
            os.environ["LOCALCHAT_HOME"] = old
    metrics = live_server.server.config.app.state.server.metrics
    before = metrics.requests[("/v1/chat/completions", 200)]
    proc = ask(env, "--json", "--temperature", "0", "--max-tokens", "16", QUESTION)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ids = smollm2_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    last = None
    for last in smollm2_engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=16)):
        pass
    assert doc["content"] == last.text
    assert doc["usage"]["prompt_tokens"] == len(ids)
    assert metrics.requests[("/v1/chat/completions", 200)] == before + 1
    proc = ask(env, "-c", "--json", "--temperature", "0", "--max-tokens", "8", "And Italy?")
    assert proc.returncode == 0, proc.stderr
    doc2 = json.loads(proc.stdout)
    assert doc2["usage"]["cached_tokens"] >= len(ids) // 16 * 16 > 0
    assert metrics.requests[("/v1/chat/completions", 200)] == before + 2
    assert [r for r, _ in history(env)] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("value,says", [
    ("100000", "smollm2-135m was trained for a context of at most 8192 tokens"),
    ("0", "the context must hold at least 2 tokens"),
    ("-5", "the context must hold at least 2 tokens"),
    ("1", "the context must hold at least 2 tokens"),  # was an internal error in ask
])
def test_serve_checks_max_model_len_as_ask_checks_context(env, value, says):
    """``serve --max-model-len`` is refused where ``ask -C`` is (exit 2, one line naming the
    flag as typed), not served with a context the model cannot use or an internal error."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "localchat.app.cli", *args],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              timeout=300, check=False)

    served = run("serve", "--port", "0", "--max-model-len", value)
    served_c = run("serve", "--port", "0", "-C", value)  # ask's name for it works too
    asked = run("ask", "--local", "--no-save", "-C", value, "hi")
    for proc, flag in ((served, "--max-model-len"), (served_c, "-C"), (asked, "-C")):
        err = proc.stderr.decode().strip()
        assert proc.returncode == 2 and err.count("\n") == 0, err
        assert err.startswith(f"localchat: error: {flag} {value}: ") and says in err


def test_serve_refuses_a_key_no_http_header_can_carry(env):
    """``serve --api-key 'cl\u00e9'`` started, then matched only clients that sent the key's
    latin-1 bytes (curl's UTF-8 got 401; the openai client and ``ask`` could not send it):
    now a usage error naming where the key came from, without the key."""
    for args, extra, origin in ((["--api-key", "cl\u00e9"], {}, "--api-key"),
                                ([], {"LOCALCHAT_API_KEY": "a key"}, "LOCALCHAT_API_KEY")):
        proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "serve", "--port",
                               "0", *args], capture_output=True, env={**env, **extra},
                              timeout=120, check=False)
        err = proc.stderr.decode().strip()
        assert proc.returncode == 2 and err.count("\n") == 0, err
        assert err == (f"localchat: error: {origin}: the key must be printable ASCII without "
                       "spaces (an HTTP header carries no other bytes)")


def test_serve_trims_a_key_as_its_clients_do(env):
    """``LOCALCHAT_API_KEY='secret '`` (a trailing space from a pasted key) started a server
    no client could use: the server compared the key untrimmed, clients (the settings) and
    curl sent it trimmed. The server now trims it too."""
    serve, _, url = start_serve({**env, "LOCALCHAT_API_KEY": " secret \n"},
                                "--max-model-len", "256")
    try:
        ok = httpx.get(url + "/v1/models", headers={"authorization": "Bearer secret"},
                       timeout=30)
        assert ok.status_code == 200, ok.text
        bad = httpx.get(url + "/v1/models", headers={"authorization": "Bearer other"},
                        timeout=30)
        assert bad.status_code == 401
    finally:
        serve.kill()
        serve.wait(30)


def test_serve_refuses_an_exposed_host_without_a_key(env):
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "serve", "--host",
                           "0.0.0.0"], capture_output=True, env=env, timeout=120, check=False)
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert err.count("\n") == 0 and "--api-key" in err and "--insecure-no-auth" in err


def test_localchat_serve_killed_mid_reply(env, tmp_path):
    """A real ``localchat serve`` (port 0), ``ask`` streaming from it, the server killed:
    ``ask`` exits 1 with one line and the question is in the history."""
    serve, _, url = start_serve(env, "--max-model-len", "2048")
    try:
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        client = subprocess.Popen(
            [sys.executable, "-m", "localchat.app.cli", "ask", "--temperature", "0",
             "--max-tokens", "1500", "Write a very long story about a lighthouse keeper."],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            assert client.stdout.read(1)  # the reply has started streaming
            serve.send_signal(signal.SIGKILL)
            serve.wait(30)
            _, err = client.communicate(timeout=120)
        finally:
            if client.poll() is None:
                client.kill()
        assert client.returncode == 1
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("localchat: error: "), lines
        assert "; the reply so far is saved in conversation " in lines[0], lines
        assert history(env)[0][0] == "user"
        assert "lighthouse" in history(env)[0][1]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)


def test_serve_stopped_by_sigterm_removes_its_state_file(env):
    """SIGTERM (what service managers send) stops ``localchat serve`` and removes its state
    file, as Ctrl+C does: no stale ``server.json`` is left for the next ``ask`` to check."""
    serve, state_file, _ = start_serve(env, "--max-model-len", "256")
    try:
        # it registers the weights' absolute path too: a local -m PATH matches by it
        # (ServerInfo.serves; tests/app/server/test_server_match.py)
        aliases = json.loads(state_file.read_text())["aliases"]
        assert any(a.endswith(".gguf") and os.path.isabs(a) and os.path.isfile(a)
                   for a in aliases), aliases
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
    assert serve.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    assert not state_file.exists()


def test_chat_jsonl_against_an_endpoint_keeps_the_history_client_side(env):
    app, seen = fake_openai()
    server = ServerThread(app).start()
    lines = "\n".join(json.dumps({"role": "user", "content": c}) for c in ("One?", "Two?"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "localchat.app.cli", "chat", "--jsonl", "--endpoint",
             server.url], input=(lines + "\n").encode(), capture_output=True, env=env,
            timeout=300, check=False)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [r["content"] for r in replies] == ["Hello world", "Hello world"]
    assert replies[1]["usage"]["cached_tokens"] == 3
    assert [m["content"] for m in seen[1]["body"]["messages"] if m["role"] != "system"] == \
        ["One?", "Hello world", "Two?"]


SECRET = "sk-local-7f3e91c2b8d4"


def test_serve_key_from_the_environment_is_required_and_never_logged(env):
    """``LOCALCHAT_API_KEY`` gives ``serve`` its key (``--help`` says so) and ``ask`` its
    bearer token: wrong or missing keys get 401, ``ask`` in the same environment answers
    through the server. With ``--log-level debug`` (access lines, ignored fields) nothing the
    server writes, nor its state file nor any response, contains the key."""
    help_text = subprocess.run([sys.executable, "-m", "localchat.app.cli", "serve", "--help"],
                               capture_output=True, env={**env, "COLUMNS": "200"},
                               timeout=120, check=True).stdout.decode()
    assert "LOCALCHAT_API_KEY" in help_text
    env = {**env, "LOCALCHAT_API_KEY": SECRET}
    serve, state_file, url = start_serve(env, "--max-model-len", "512", "--log-level", "debug",
                                         stdout=subprocess.PIPE)
    try:
        text = state_file.read_text()
        assert json.loads(text)["auth"] is True and SECRET not in text
        bodies = []
        for headers in ({}, {"authorization": "Bearer wrong"},
                        {"authorization": f"Basic {SECRET}"}):
            r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
            assert r.status_code == 401
            bodies.append(r.text)
        good = {"authorization": f"Bearer {SECRET}"}
        r = httpx.post(url + "/v1/chat/completions", headers=good, timeout=120, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "temperature": 0, "user": "someone", "metadata": {"k": "v"}})
        assert r.status_code == 200, r.text
        bodies.append(r.text)
        proc = ask(env, "--json", "--temperature", "0", "--max-tokens", "2", QUESTION)
        assert proc.returncode == 0, proc.stderr
        metrics = httpx.get(url + "/metrics", headers=good, timeout=30).text
        assert 'requests_total{route="/v1/chat/completions",status="200"} 2' in metrics
        bodies += [metrics, httpx.get(url + "/health", timeout=30).text]
        assert not any(SECRET in b for b in bodies)
        serve.send_signal(signal.SIGINT)
        out, err = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
    log = out.decode() + err.decode()
    assert serve.returncode in (0, 130), log  # 130: stopped by Ctrl+C (SIGINT)
    assert "ignored request fields: metadata, user" in log  # debug logging was on
    assert "/v1/models" in err.decode() and "401" in err.decode()  # access lines, on stderr
    assert "/v1/models" not in out.decode()  # (stdout stays the program's, not the log's)
    assert SECRET not in log
    assert not state_file.exists()
