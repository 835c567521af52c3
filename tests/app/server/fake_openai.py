"""Fake OpenAI-compatible servers (FastAPI apps for ``live.ServerThread``) and the ``ask`` /
history helpers of the tests that talk to them: one that streams "Hello" " world" (or dies
mid-reply), one that refuses every chat request, one that ignores ``stop``."""

from __future__ import annotations

import json
import subprocess
import sys

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

QUESTION = "What is the capital of France?"


def ask(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", "ask", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, env=env,
                          timeout=timeout, check=False)


def history(env) -> list[tuple[str, str]]:
    proc = subprocess.run([sys.executable, "-c", (
        "from localchat.app.store import Store; s = Store(); c = s.most_recent(); "
        "import json; print(json.dumps([(m.role, m.content) for m in c.messages] if c else []))"
    )], capture_output=True, env=env, timeout=120, check=True)
    return [tuple(m) for m in json.loads(proc.stdout)]


def list_fake_model(app: FastAPI, max_model_len: int | None = None) -> None:
    """``GET /v1/models`` on ``app`` lists ``fake-model`` (with ``max_model_len``, as vLLM and
    ``localchat serve`` do, when given)."""
    card = {"id": "fake-model", "object": "model"}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card]})


def fake_openai(die_after: int | None = None, max_model_len: int | None = None
                ) -> tuple[FastAPI, list[dict]]:
    """A minimal OpenAI-compatible server: lists ``fake-model`` (and its ``max_model_len``
    when given), streams "Hello" " world" (and usage); with ``die_after``, it drops the
    connection after that many chunks."""
    app = FastAPI()
    seen: list[dict] = []

    @app.get("/health")  # as ``localchat serve`` answers it (found through its state file)
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "model": "fake-model", "auth": False})

    list_fake_model(app, max_model_len)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("authorization")})

        async def events():
            for i, piece in enumerate(["Hello", " world"]):
                if die_after is not None and i >= die_after:
                    raise RuntimeError("server killed")  # uvicorn drops the connection
                chunk = {"choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            usage = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
                     "prompt_tokens_details": {"cached_tokens": 3}}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, seen


def refusing_openai() -> FastAPI:
    """An OpenAI-compatible server that turns every chat request down with 400, as
    ``localchat serve`` does a prompt longer than its context."""
    app = FastAPI()

    list_fake_model(app)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"error": {"message": "the prompt is 9035 tokens but the context "
                                       "holds 8192 tokens", "type": "invalid_request_error"}},
                            status_code=400)

    return app


def stop_ignoring_openai(pieces: list[str], whole: bool = False) -> FastAPI:
    """An OpenAI-compatible server that ignores ``stop``: it streams ``pieces`` (or, with
    ``whole``, answers one chat completion of their text, ignoring ``stream`` too)."""
    app = FastAPI()

    list_fake_model(app)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        if whole:
            return JSONResponse({"choices": [{"index": 0, "finish_reason": "length",
                                              "message": {"role": "assistant",
                                                          "content": "".join(pieces)}}]})

        async def events():
            for piece in pieces:
                chunk = {"choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
