"""The FastAPI app: OpenAI-compatible routes over one ``AsyncLLMEngine``.

``create_app(engine, ServerOptions(...))`` builds it. Every client's requests go to the same
engine, so they share continuous batching and the prefix cache (a conversation's earlier turns
are prefilled once). Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``
(server-sent events with ``stream: true``), ``GET /v1/models``, ``GET /v1/models/{model}``,
``GET /health``, ``GET /metrics``. A client that disconnects aborts its request (its KV
blocks are freed). Every path but ``/health`` needs the API key when one is set, checked
before the body is read (``limits.BodyLimitMiddleware``). A request's prompt ids come from
``prompt_ids.py``, in a worker thread (a long prompt's tokenization does not hold up the
event loop, so other requests' streams go on); answering it (JSON or server-sent events,
aborts, errors) is ``generation.py``.
Reference design: vLLM's OpenAI server (``serving_chat``), llama-cpp-python's server.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from localchat.app.server import encode
from localchat.app.server.errors import APIError, install_handlers
from localchat.app.server.generation import generate
from localchat.app.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware, check_api_key
from localchat.app.server.metrics import ServerMetrics, StatusCounter
from localchat.app.server.prompt_ids import context_length_error, encode_prompt, render_chat
from localchat.app.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ignored_fields,
    parse_body,
)
from localchat.app.server.shutdown import ShutdownSignal, shutting_down_error

DEFAULT_MAX_IN_FLIGHT = 64
# Seconds a client told "queue full" (429) should wait before retrying.
RETRY_AFTER_S = 1
logger = logging.getLogger("localchat.server")


@dataclass(frozen=True)
class ServerOptions:
    """How the app serves.

    Attributes:
        model_id: the id ``/v1/models`` lists and requests name (e.g. ``smollm2-135m``).
        aliases: other names accepted in a request's ``model`` (the spec the user gave).
        api_key: required bearer token, or None for no authentication.
        max_body_bytes: larger request bodies get 413.
        max_in_flight: admitted, unfinished requests beyond this get 429.
        max_tokens_limit: the most tokens one reply may have; a larger ``max_tokens`` is
            capped to it (None: the context).
    """

    model_id: str
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_tokens_limit: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class _Server:
    """State shared by the routes: the engine, the options, metrics, the in-flight count."""

    def __init__(self, engine: Any, options: ServerOptions) -> None:
        self.engine = engine
        self.options = options
        self.metrics = ServerMetrics()
        self.in_flight = 0
        self.last_active = time.monotonic()  # when a request last began or ended
        self.shutdown = ShutdownSignal()
        self.max_model_len = int(engine.max_model_len)
        self.max_tokens_limit = min(options.max_tokens_limit or self.max_model_len,
                                    self.max_model_len)

    def begin_request(self) -> None:
        """Count an admitted request in flight."""
        self.in_flight += 1
        self.last_active = time.monotonic()

    def end_request(self) -> None:
        """Count a request finished (answered, streamed to its end, failed or aborted)."""
        self.in_flight -= 1
        self.last_active = time.monotonic()

    # -- checks ---------------------------------------------------------------------------

    def authorize(self, request: Request) -> None:
        check_api_key(request.headers.get("authorization"), self.options.api_key)

    def authorized(self, request: Request) -> bool:
        """Whether ``request`` may see more than liveness: no key is set, or it carries it."""
        try:
            self.authorize(request)
        except APIError:
            return False
        return True

    def check_model(self, name: str | None) -> None:
        if name is None or name == self.options.model_id or name in self.options.aliases:
            return
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                       f"'{self.options.model_id}'", param="model", code="model_not_found")

    def admit(self) -> None:
        if self.shutdown.stopping:
            raise shutting_down_error()
        if not getattr(self.engine, "is_running", True):
            raise APIError(503, "the engine has stopped; restart the server",
                           code="engine_dead")
        if self.in_flight >= self.options.max_in_flight:
            raise APIError(429, f"the server is busy: {self.in_flight} requests in flight "
                           f"(limit {self.options.max_in_flight}); retry later",
                           code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})

    def check_lengths(self, num_prompt: int, max_tokens: int | None,
                      prompt_param: str) -> int:
        """The ``max_tokens`` to run with: the request's, capped to the server's limit and
        to the room the prompt leaves in the context (the reply then ends with
        ``finish_reason`` ``length``), as llama-server and Ollama do; clients often send a
        large ``max_tokens`` whatever the model. ``prompt_param`` names the request's prompt
        field (``messages`` or ``prompt``).

        Raises:
            APIError: 400 ``context_length_exceeded`` when the prompt leaves no room (both
                numbers named).
        """
        if num_prompt >= self.max_model_len:
            raise context_length_error(num_prompt, self.max_model_len, prompt_param)
        room = self.max_model_len - num_prompt
        return min(max_tokens or self.max_tokens_limit, self.max_tokens_limit, room)


def begin_shutdown(app: FastAPI) -> None:
    """Stop ``app``'s in-flight requests before the HTTP server shuts down: each stream ends
    with an error event and ``data: [DONE]``, each waiting request gets a 503, its engine
    request aborted; new requests get the 503 (``shutdown.py``)."""
    app.state.server.shutdown.begin()


def activity(app: FastAPI) -> tuple[int, float]:
    """``app``'s generation requests in flight and the ``time.monotonic()`` at which one last
    began or ended (``/health`` and ``/v1/models`` do not count: a client looking for the
    server keeps nothing alive); ``serve --keep-alive`` compares them with its limit."""
    server = app.state.server
    return server.in_flight, server.last_active


def create_app(engine: Any, options: ServerOptions) -> FastAPI:
    """The ASGI app serving ``engine`` (an ``AsyncLLMEngine`` or a stand-in with the same
    ``generate`` / ``get_stats`` / ``get_info`` / ``tokenizer`` / ``max_model_len``).
    ``/health`` answers liveness (``status``, ``auth``) to anyone, so clients find the
    server before they know whether it wants a key; the rest (model, context, queue, KV
    usage and the engine's ``EngineInfo`` as its ``engine`` object, a localchat extension
    read back by ``AsyncRemoteEngine.get_info``) only with the key when one is set."""
    server = _Server(engine, options)
    # No redirect for a trailing slash (FastAPI's bare 307): an unknown path is a 404.
    app = FastAPI(title="localchat", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    app.state.server = server
    install_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=options.max_body_bytes,
                       api_key=options.api_key)
    app.add_middleware(StatusCounter, metrics=server.metrics)

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: `curl -I` health checks
    async def health(request: Request) -> JSONResponse:
        alive = getattr(engine, "is_running", True)
        body: dict[str, Any] = {"status": "ok" if alive else "engine_dead",
                                "auth": options.api_key is not None}
        if server.authorized(request):  # what is served and how: not for a keyless caller
            stats = engine.get_stats()
            body.update({"model": options.model_id, "max_model_len": server.max_model_len,
                         "running": stats.num_running, "waiting": stats.num_waiting,
                         "kv_cache_usage": stats.kv_cache_usage,
                         "engine": encode.engine_info_json(engine.get_info())})
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        server.authorize(request)
        text = server.metrics.render(engine.get_stats(), server.in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        server.authorize(request)
        return JSONResponse({"object": "list", "data": [encode.model_card(
            options.model_id, options.created, server.max_model_len)]})

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> JSONResponse:
        """One model's object (the ``openai`` client's ``models.retrieve``): the served
        model under its id or an alias, else 404 ``model_not_found``."""
        server.authorize(request)
        server.check_model(model)
        return JSONResponse(encode.model_card(options.model_id, options.created,
                                              server.max_model_len))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        server.authorize(request)
        body = parse_body(await request.body(), ChatCompletionRequest)
        _log_ignored(request, body)
        server.check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                           code="invalid_value")
        prompt_ids = await run_in_threadpool(render_chat, engine.tokenizer, body,
                                             server.max_model_len)
        max_tokens = server.check_lengths(
            len(prompt_ids), body.max_completion_tokens or body.max_tokens, "messages")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        params = encode.sampling_params(body, max_tokens, logprobs)
        return await generate(server, request, "chat", prompt_ids, params, body)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        server.authorize(request)
        body = parse_body(await request.body(), CompletionRequest)
        _log_ignored(request, body)
        server.check_model(body.model)
        prompt_ids = await run_in_threadpool(encode_prompt, engine.tokenizer, body.prompt,
                                             server.max_model_len)
        max_tokens = server.check_lengths(len(prompt_ids), body.max_tokens or 16, "prompt")
        params = encode.sampling_params(body, max_tokens, body.logprobs)
        return await generate(server, request, "text", prompt_ids, params, body)

    return app


def _log_ignored(request: Request, body: Any) -> None:
    """Log at debug the OpenAI fields the request set that this server ignores."""
    if logger.isEnabledFor(logging.DEBUG):
        names = ignored_fields(body)
        if names:
            logger.debug("%s: ignored request fields: %s", request.url.path, ", ".join(names))
