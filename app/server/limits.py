"""Request bounds and the API key check.

``BodyLimitMiddleware`` (pure ASGI) reads each request body up to ``max_body_bytes`` and
answers 413 in OpenAI's error shape beyond it, without keeping the excess in memory (it is
read and dropped, up to a hard cap, so the client sees the 413 instead of a reset socket).
``check_api_key`` compares the ``Authorization: Bearer`` token in constant time; the key is
never logged or echoed.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from localchat.app.server.errors import APIError, error_body

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
# Beyond this the excess is not even drained: the connection is answered and closed.
_DRAIN_CAP_BYTES = 64 * 2**20


class BodyLimitMiddleware:
    """Answer 413 to HTTP requests whose body exceeds ``max_body_bytes`` bytes."""

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # disconnected before the body ended
                return
            body = message.get("body", b"")
            total += len(body)
            if total <= self.max_body_bytes:
                chunks.append(body)
            more = message.get("more_body", False)
            if total > _DRAIN_CAP_BYTES:
                break
        if total > self.max_body_bytes:
            await _send_json(send, 413, error_body(
                413, f"request body is {'over ' if more else ''}{total} bytes; the limit is "
                f"{self.max_body_bytes}", code="body_too_large"))
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_json(send: Any, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


def check_api_key(authorization: str | None, api_key: str | None) -> None:
    """Refuse a request whose bearer token is not ``api_key`` (no check when it is None).

    Raises:
        APIError: 401, missing or wrong key (the message never contains either key).
    """
    if api_key is None:
        return
    if not authorization:
        raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'",
                       code="missing_api_key")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             api_key.encode()):
        raise APIError(401, "invalid API key", code="invalid_api_key")
