"""Routes and transport of ``localchat serve``'s app over ``ScriptedEngine`` (``scripted.py``),
each pinning a defect a tester found: ``GET /v1/models/{model}`` was missing, a 429 had no
``Retry-After``, the body was read before the key was checked (and a declared oversized body
was not refused up front), a trailing slash got FastAPI's bare 307, a 405 had no ``Allow``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import openai
import pytest
from fastapi.testclient import TestClient

from tests.app.server.scripted import CHAT, COMP, KEY, MODEL_ID, USER, assert_error, make_app, post

# -- 8. GET /v1/models/{model} ----------------------------------------------------------------


def test_models_retrieve_with_the_openai_client(engine):
    app = make_app(engine, aliases=("smollm2",))
    with TestClient(app) as http, openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http,
            max_retries=0) as oa:
        listed = oa.models.list().data[0]
        for name in (MODEL_ID, "smollm2"):
            got = oa.models.retrieve(name)
            assert got.id == MODEL_ID == listed.id and got.object == "model"
            assert got.created == listed.created and got.owned_by == listed.owned_by
        with pytest.raises(openai.NotFoundError) as info:
            oa.models.retrieve("gpt-9")
        assert info.value.code == "model_not_found"
        assert info.value.body["param"] == "model"


def test_a_model_id_with_a_slash_is_retrieved(engine):
    from localchat.app.server.routes import ServerOptions, create_app

    app = create_app(engine, ServerOptions(model_id="HuggingFaceTB/SmolLM2-135M-Instruct"))
    with TestClient(app) as c:
        r = c.get("/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct")
        assert r.status_code == 200 and r.json()["id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert_error(c.get("/v1/models/HuggingFaceTB"), 404, "model", "model_not_found")
        text = c.get("/metrics").text
        assert 'route="/v1/models/{model}",status="200"' in text
        assert 'route="/v1/models/{model}",status="404"' in text


def test_models_retrieve_needs_the_key(engine):
    with TestClient(make_app(engine, api_key=KEY)) as c:
        assert_error(c.get(f"/v1/models/{MODEL_ID}"), 401, None)
        r = c.get(f"/v1/models/{MODEL_ID}", headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["id"] == MODEL_ID


# -- 10. Retry-After on 429 ---------------------------------------------------------------------


def test_queue_full_has_retry_after(engine):
    with TestClient(make_app(engine, max_in_flight=0)) as c:
        for path, body in ((CHAT, {"messages": USER}), (COMP, {"prompt": "hi"})):
            r = post(c, path, body)
            assert_error(r, 429, None, "queue_full")
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert r.headers["retry-after"].isdigit() and 1 <= int(r.headers["retry-after"]) <= 60


# -- 11. the key before the body; a declared oversized body refused up front ----------------------


def call_asgi(app, path, headers, body_parts, method="POST"):
    """Call ``app`` directly; returns (status, headers, body, receive calls)."""
    calls = 0
    parts = list(body_parts)
    sent = []

    async def receive():
        nonlocal calls
        calls += 1
        if parts:
            chunk = parts.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(parts)}
        await asyncio.sleep(3600)  # a client still sending

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
             "server": ("testserver", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, calls


def test_the_key_is_checked_before_the_body_is_read(engine):
    app = make_app(engine, api_key=KEY)
    big = [b"x" * 65536] * 8
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY}"}):
        for path in (CHAT, COMP, "/v1/models", "/v1/nope"):
            status, hdrs, body, calls = call_asgi(
                app, path, {"content-type": "application/json", "content-length": str(2**19),
                            **headers}, big)
            assert status == 401, (path, headers)
            assert calls == 0, "the body was read before the key was checked"
            assert hdrs[b"www-authenticate"] == b"Bearer"
            assert json.loads(body)["error"]["type"] == "authentication_error"
            assert KEY.encode() not in body
    # /health stays public; with the key the request goes through.
    status, _, body, _ = call_asgi(app, "/health", {}, [b""], method="GET")
    assert status == 200 and json.loads(body) == {"status": "ok", "auth": True}
    status, _, _, calls = call_asgi(app, CHAT, {"authorization": f"Bearer {KEY}",
                                                "content-length": "2"}, [b"{}"])
    assert status == 400 and calls >= 1


def test_a_declared_oversized_body_is_refused_before_reading(engine):
    app = make_app(engine, api_key=KEY, max_body_bytes=1000)
    status, hdrs, body, calls = call_asgi(
        app, CHAT, {"authorization": f"Bearer {KEY}", "content-length": "99999999"}, [b"{}"])
    assert status == 413 and calls == 0
    err = json.loads(body)["error"]
    assert err["code"] == "body_too_large" and "99999999" in err["message"]
    assert hdrs[b"connection"] == b"close"
    # At the limit the body is read; a chunked body over it is still refused once read.
    status, _, _, calls = call_asgi(app, CHAT, {"authorization": f"Bearer {KEY}",
                                                "content-length": "1000"}, [b" " * 998 + b"{}"])
    assert status == 400 and calls == 1
    status, _, _, calls = call_asgi(app, CHAT, {"authorization": f"Bearer {KEY}",
                                                "transfer-encoding": "chunked"},
                                    [b" " * 600, b" " * 600])
    assert status == 413 and calls == 2
    text = TestClient(app).get("/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    assert f'localchat_requests_total{{route="{CHAT}",status="413"}} 2' in text


def test_a_live_server_answers_413_at_once(engine):
    """Over a socket (uvicorn): a declared Content-Length of 99999999 with a 2-byte body
    gets its 413 at once, without the server waiting for the rest."""
    from tests.app.server.live import ServerThread

    server = ServerThread(make_app(engine, api_key=KEY)).start()
    try:
        host, port = server.url.removeprefix("http://").split(":")
        for auth, status in ((f"Authorization: Bearer {KEY}\r\n", b"413"), ("", b"401")):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                start = time.monotonic()
                sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: "
                             "application/json\r\nContent-Length: 99999999\r\n\r\n{}".encode())
                reply = b""
                while b"\r\n\r\n" not in reply:
                    data = sock.recv(65536)
                    if not data:
                        break
                    reply += data
                assert reply.split(b" ")[1] == status, reply
                assert time.monotonic() - start < 5
    finally:
        server.stop()


# -- 13. a trailing slash, HEAD and OPTIONS ------------------------------------------------------


@pytest.mark.parametrize("method,path", [("POST", CHAT + "/"), ("POST", COMP + "/"),
                                         ("GET", "/health/"), ("GET", "/metrics/")])
def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(client, engine, method, path):
    """It was FastAPI's bare 307 with an empty body; the README promises a 404."""
    r = client.request(method, path, content=json.dumps({"messages": USER}).encode(),
                       headers={"content-type": "application/json"}, follow_redirects=False)
    err = assert_error(r, 404, None)
    assert err["message"] == f"no route {method} {path}" and "location" not in r.headers
    assert engine.params == []


@pytest.mark.parametrize("method,path,allow", [
    ("OPTIONS", CHAT, "POST"), ("OPTIONS", "/health", "GET, HEAD"), ("HEAD", "/v1/models", "GET"),
    ("HEAD", COMP, "POST"), ("PUT", "/v1/models", "GET")])
def test_a_wrong_method_is_a_405_naming_the_allowed_one(client, method, path, allow):
    r = client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow
    if method != "HEAD":  # a HEAD answer has no body
        err = assert_error(r, 405, None)
        assert err["message"] == f"method {method} is not allowed on {path}"


def test_head_on_health_answers_for_curl_i_checks(client):
    """``curl -I /health`` (a load balancer's or a script's liveness check) got a 405."""
    r = client.request("HEAD", "/health")
    assert r.status_code == 200 and r.content == b""
