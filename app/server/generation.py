"""Answering one generation request of the OpenAI routes: admit it, stream the engine's
outputs as one JSON body or as server-sent events, abort it when the client disconnects or the
server stops, and map every failure to an OpenAI-shaped error (never a traceback).
Reference design: vLLM's OpenAI server (``serving_chat``), llama-cpp-python's server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from localchat.app.server import encode
from localchat.app.server.errors import APIError
from localchat.app.server.shutdown import shutting_down_error

logger = logging.getLogger("localchat.server")


async def generate(server: Any, request: Request, kind: str, prompt_ids: list[int],
                    params: Any, body: Any) -> Any:
    """Admit the request, wait for its first output (errors get their status), then answer
    as one JSON body or as server-sent events. A disconnect at any point aborts it."""
    server.admit()
    server.begin_request()
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    outputs = server.engine.generate(prompt_ids, params, request_id=rid)
    shape = encode.ResponseShape(kind, rid, server.options.model_id, int(time.time()),
                                 server.engine.tokenizer, params.logprobs)
    handed_over = False
    try:
        first = await _until_disconnect(server, request, outputs.__anext__())
        if first is None:  # the client left before the first token
            await outputs.aclose()
            server.metrics.record_finished(None, aborted=True)
            return JSONResponse({}, status_code=499)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            handed_over = True
            return StreamingResponse(
                _sse(server, outputs, first, shape, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        collected = await _until_disconnect(server, request, _collect(outputs, first))
        if collected is None:
            await outputs.aclose()
            server.metrics.record_finished(None, aborted=True)
            return JSONResponse({}, status_code=499)
        server.metrics.record_finished(collected[-1], aborted=False)
        return JSONResponse(shape.whole(collected))
    except StopAsyncIteration:
        raise APIError(500, "the engine ended the request without output") from None
    except Exception as exc:  # noqa: BLE001 - mapped to an OpenAI error, never a trace
        await _close(outputs)
        raise _as_api_error(exc, _prompt_param(kind)) from None
    finally:
        if not handed_over:
            server.end_request()


async def _until_disconnect(server: Any, request: Request, awaitable: Any) -> Any:
    """Await ``awaitable``, or return None (cancelling it) when the client disconnects.

    Raises:
        APIError: 503 when the server begins shutting down first (``awaitable`` cancelled).
    """
    done, work = await server.shutdown.race(
        awaitable, asyncio.ensure_future(_disconnected(request)))
    if work in done:
        return work.result()
    if server.shutdown.stopping:
        raise shutting_down_error()
    return None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(outputs: AsyncIterator[Any], first: Any) -> list[Any]:
    collected = [first]
    if not first.finished:
        async for out in outputs:
            collected.append(out)
            if out.finished:
                break
    return collected


async def _sse(server: Any, outputs: Any, first: Any, shape: encode.ResponseShape,
               include_usage: bool) -> AsyncIterator[bytes]:
    """The event stream: a role chunk (chat), content chunks, the finish chunk, the usage
    chunk when asked, ``[DONE]``. Cancelled (client gone) -> the request is aborted. The
    server stopping -> the request is aborted, an error event (503 ``server_shutting_down``)
    and ``[DONE]`` end the stream."""
    last = None
    finished = False
    try:
        for chunk in shape.opening():
            yield encode.sse(chunk)
        out = first
        while True:
            last = out
            for chunk in shape.delta(out):
                yield encode.sse(chunk)
            if out.finished:
                finished = True
                break
            out = await server.shutdown.next_output(outputs)
            if out is None:
                yield encode.sse(shutting_down_error().body())
                yield b"data: [DONE]\n\n"
                return
        if include_usage:
            yield encode.sse(shape.usage_chunk(last))
        yield b"data: [DONE]\n\n"
    except StopAsyncIteration:
        yield b"data: [DONE]\n\n"
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client gets an error event, never a trace
        err = _as_api_error(exc, _prompt_param(shape.kind))
        yield encode.sse(err.body())
    finally:
        server.end_request()
        server.metrics.record_finished(last, aborted=not finished)
        await _close(outputs)


async def _close(outputs: Any) -> None:
    with contextlib.suppress(Exception):
        await outputs.aclose()


def _prompt_param(kind: str) -> str:
    """The request field that holds the prompt: ``messages`` (chat) or ``prompt``."""
    return "messages" if kind == "chat" else "prompt"


def _as_api_error(exc: BaseException, prompt_param: str | None = None) -> APIError:
    from localchat.engine.errors import ContextLengthError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), code="invalid_value")
    if type(exc).__name__ == "EngineDeadError":
        return APIError(503, "the engine has stopped; restart the server", code="engine_dead")
    logger.error("generation failed: %s: %s", type(exc).__name__, exc)
    return APIError(500, f"generation failed ({type(exc).__name__})", code="internal_error")
