"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server reports goes through ``APIError`` (or the handlers in
``install_handlers``), so a client always gets this JSON with a meaningful status and never a
traceback. Statuses (the README's table): 400 bad field or prompt over the context, 401 bad
or missing key, 404 unknown model or path, 405 wrong method, 413 body too large, 429 queue
full, 503 engine stopped, 500 a bug (logged server-side, message without internals).
Reference: the OpenAI API's error object; vLLM's ``ErrorResponse``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("localchat.server")

# HTTP status -> OpenAI error ``type``.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A request the server refuses or cannot answer.

    Args:
        status: the HTTP status (see the module docstring).
        message: one line for the client (never a traceback, never the API key).
        param: the request field at fault (dotted path), or None.
        code: a short machine-readable code (``context_length_exceeded``, ``model_not_found``).
        headers: extra response headers (``Retry-After`` on a 429).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The JSON error object for ``status`` (``type`` from ``ERROR_TYPES``)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None
                   ) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers)


def install_handlers(app: FastAPI) -> None:
    """Map ``APIError``, Starlette's HTTP errors (404 path, a trailing slash included; 405
    method, ``HEAD`` and ``OPTIONS`` included, with its ``Allow`` header) and any other
    exception to OpenAI-shaped JSON."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        return error_response(exc.status, exc.message, exc.param, exc.code,
                              {**headers, **exc.headers})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        headers = dict(exc.headers or {})
        for name in [k for k in headers if k.lower() == "allow"]:  # Starlette's set order
            headers[name] = ", ".join(sorted(m.strip() for m in headers[name].split(",")))
        return error_response(exc.status_code, message, code=None, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.error("internal error: %s: %s", type(exc).__name__, exc)
        return error_response(500, f"internal server error ({type(exc).__name__})")
