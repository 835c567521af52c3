"""Stopping a real ``localchat serve`` (a subprocess) while it answers: Ctrl+C (SIGINT) or
SIGTERM ends an in-flight stream with the ``server_shutting_down`` error event and
``data: [DONE]``, answers a waiting non-streaming request with that 503, and the process
exits promptly with no traceback. Before the fix uvicorn waited its 5 s graceful timeout,
then cancelled the tasks: a traceback on stderr and streams cut without ``[DONE]``."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.app.server.live import start_serve

STORY = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 1500,
         "messages": [{"role": "user", "content": "Write a very long story about a ship."}]}
# Seconds from the signal to the process's exit (uvicorn's old graceful timeout alone was 5).
EXIT_BOUND_S = 4.5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_stopping_ends_in_flight_requests_properly(env, sig):
    serve, _, url = start_serve(env, "--max-model-len", "2048")
    waiting: dict[str, httpx.Response] = {}

    def whole() -> None:
        waiting["r"] = httpx.post(url + "/v1/chat/completions", json=STORY, timeout=120)

    try:
        events: list[str] = []
        with httpx.stream("POST", url + "/v1/chat/completions", json={**STORY, "stream": True},
                          timeout=120) as stream:
            lines = stream.iter_lines()
            while len([e for e in events if '"content"' in e]) < 3:  # the reply is streaming
                line = next(lines)
                if line.startswith("data: "):
                    events.append(line[6:])
            other = threading.Thread(target=whole)
            other.start()
            deadline = time.monotonic() + 60
            while True:  # both requests are in the engine
                health = httpx.get(url + "/health", timeout=10).json()
                if health["running"] + health["waiting"] == 2:
                    break
                assert time.monotonic() < deadline, health
                time.sleep(0.05)
            serve.send_signal(sig)
            signalled = time.monotonic()
            events += [line[6:] for line in lines if line.startswith("data: ")]
        serve.wait(30)
        exit_s = time.monotonic() - signalled
        other.join(30)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
    err = serve.stderr.read().decode()
    assert "Traceback" not in err and "ERROR" not in err, err
    assert exit_s < EXIT_BOUND_S, (exit_s, err)
    assert serve.returncode in (0, 128 + sig, -sig), (serve.returncode, err)
    # One line says why the server went away and what it ended (both requests).
    name = "Ctrl+C" if sig == signal.SIGINT else "SIGTERM"
    assert f"localchat: stopping ({name}); ending 2 requests in flight" in err, err
    # The stream: content, then the error event, then [DONE], nothing after it.
    assert events[-1] == "[DONE]", events[-3:]
    final = json.loads(events[-2])
    assert final["error"]["code"] == "server_shutting_down", final
    assert all("choices" in json.loads(e) for e in events[:-2])
    assert not any(json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2])
    # The non-streaming request: a 503 in OpenAI's shape.
    response = waiting["r"]
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "server_shutting_down"
