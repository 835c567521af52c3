"""Load and faults on a live server (127.0.0.1) at the issue's counts, kept fast for a 2-core
CI by short replies (3 greedy tokens) on the SmolLM2 test model and one server for the run.

- 16 concurrent streaming clients x 32 requests each (512): all complete within a bound,
  greedy replies equal the single-request replies of a separately loaded engine, every
  request is counted once as a 200 (none lost), KV usage back to 0.
- 50 clients that disconnect mid-stream, a non-streaming client that gives up before its
  reply, a client that never reads: the server keeps serving (a later reply is still the
  reference), every request is aborted or finished, KV usage back to 0.
- A full queue answers 429 in OpenAI's error shape.

Run time: the whole file used 133 s of CPU (user + sys) on the 2-core dev machine, so
about 70-130 s of wall time when idle (456 s measured at load average 17): over the 60 s
mark because of the issue's counts (512 streamed requests, each a short prefill and 3 decode
steps in batches of up to 16, plus the HTTP and SSE work of both ends in one process) and
because it loads the two engines it shares with the other server tests (reference and
served). Each wait is bounded (480 s for the load, 300 s for the disconnects).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from localchat.engine.sampling_params import SamplingParams
from tests.app.server.conftest import MODEL_ID, serve

PROMPTS = ["Name a fruit.", "Name a planet.", "What colour is the sky?", "Say a greeting.",
           "Name a river.", "What is two plus two?", "Name a bird.", "Say goodbye."]
TOKENS = 3
CLIENTS = 16
REQUESTS_PER_CLIENT = 32
LEAVERS = 50


def wait_idle(engine, timeout: float = 30.0) -> None:
    """Wait (bounded) until no request is running or waiting and no KV block is held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.get_stats()
        if s.num_running == 0 and s.num_waiting == 0 and s.kv_cache_usage == 0.0:
            return
        time.sleep(0.05)
    s = engine.get_stats()
    raise AssertionError(f"engine not idle: running {s.num_running}, waiting {s.num_waiting}, "
                         f"kv usage {s.kv_cache_usage}")


def body(prompt: str, max_tokens: int = TOKENS, stream: bool = True) -> dict:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": max_tokens, "stream": stream}


@pytest.fixture(scope="module")
def references(smollm2_engine):
    refs = {}
    for prompt in PROMPTS:
        ids = smollm2_engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True)
        last = None
        for last in smollm2_engine.generate(ids, SamplingParams(temperature=0.0,
                                                                max_tokens=TOKENS)):
            pass
        refs[prompt] = last.text
    return refs


async def stream_reply(client: httpx.AsyncClient, prompt: str) -> tuple[str, str | None]:
    """Stream one chat reply; returns (text, finish_reason)."""
    text, reason = [], None
    async with client.stream("POST", "/v1/chat/completions", json=body(prompt)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content", ""))
                reason = choice["finish_reason"] or reason
    return "".join(text), reason


def test_sixteen_concurrent_streaming_clients(live_server, async_engine, references):
    state = live_server.server.config.app.state.server
    ok_before = state.metrics.requests[("/v1/chat/completions", 200)]

    async def client_task(i: int) -> list[tuple[str, str, str | None]]:
        out = []
        async with httpx.AsyncClient(base_url=live_server.url, timeout=120) as c:
            for j in range(REQUESTS_PER_CLIENT):
                prompt = PROMPTS[(i + j) % len(PROMPTS)]
                out.append((prompt, *await stream_reply(c, prompt)))
        return out

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(*(client_task(i) for i in range(CLIENTS))), timeout=480)

    results = [r for rs in asyncio.run(main()) for r in rs]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    for prompt, text, reason in results:
        assert text == references[prompt], prompt
        assert reason in ("stop", "length")
    wait_idle(async_engine)
    assert state.in_flight == 0
    assert state.metrics.requests[("/v1/chat/completions", 200)] - ok_before == len(results)


def test_disconnects_mid_stream_free_their_blocks(live_server, async_engine, references):
    aborted_before = live_server.server.config.app.state.server.metrics.aborted

    async def leaver(i: int) -> None:
        async with (httpx.AsyncClient(base_url=live_server.url, timeout=120) as c,
                    c.stream("POST", "/v1/chat/completions",
                             json=body(PROMPTS[i % 4] + f" ({i})", max_tokens=400)) as r):
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if '"content": "' in line and '"role"' not in line:
                    break  # first content chunk: hang up

    async def main():
        await asyncio.wait_for(asyncio.gather(*(leaver(i) for i in range(LEAVERS))),
                               timeout=300)

    asyncio.run(main())
    wait_idle(async_engine)
    state = live_server.server.config.app.state.server
    assert state.in_flight == 0
    assert state.metrics.aborted - aborted_before == LEAVERS
    # The server keeps serving, with the same replies.
    r = httpx.post(live_server.url + "/v1/chat/completions", json=body(PROMPTS[0], stream=False),
                   timeout=120)
    assert r.json()["choices"][0]["message"]["content"] == references[PROMPTS[0]]


def test_non_streaming_client_that_gives_up_is_aborted(live_server, async_engine):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live_server.url + "/v1/chat/completions",
                   json=body("Write a long story about a dragon.", max_tokens=1500,
                             stream=False), timeout=1.0)
    wait_idle(async_engine)
    assert live_server.server.config.app.state.server.in_flight == 0


def test_a_client_that_never_reads(live_server, async_engine, references):
    host, port = live_server.url.removeprefix("http://").split(":")
    payload = json.dumps(body("Tell me about rivers.", max_tokens=300)).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        # While it never reads, others are served with the reference replies.
        for prompt in PROMPTS[:2]:
            r = httpx.post(live_server.url + "/v1/chat/completions",
                           json=body(prompt, stream=False), timeout=120)
            assert r.json()["choices"][0]["message"]["content"] == references[prompt]
    finally:
        sock.close()
    wait_idle(async_engine)
    deadline = time.monotonic() + 30
    state = live_server.server.config.app.state.server
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.in_flight == 0


def test_full_queue_answers_429(async_engine):
    server = serve(async_engine, max_in_flight=1)
    state = server.server.config.app.state.server
    try:
        with (httpx.Client(base_url=server.url, timeout=120) as c,
              c.stream("POST", "/v1/chat/completions",
                       json=body("Count to a hundred.", max_tokens=300)) as held):
            assert held.status_code == 200
            lines = held.iter_lines()
            next(lines)  # admitted and streaming
            assert state.in_flight == 1
            r = c.post("/v1/chat/completions", json=body("Hi.", stream=False))
            assert r.status_code == 429
            err = r.json()["error"]
            assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
            assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
        wait_idle(async_engine)
        r = httpx.post(server.url + "/v1/chat/completions", json=body("Hi.", stream=False),
                       timeout=120)
        assert r.status_code == 200
    finally:
        server.stop()
