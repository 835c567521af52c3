"""Request bounds and the API key check.

``BodyLimitMiddleware`` (pure ASGI) is the gate every HTTP request passes before any of its
body is read: first the API key (401 unless the path is public, ``/health``), then the
declared ``Content-Length`` (413 when it is over ``max_body_bytes``: at once, reading no byte
of body, when it is over the drain cap or the client waits on ``Expect: 100-continue``,
which is then never told to send it; else after reading and dropping the body the client
sends anyway, so that closing the connection does not reset it and lose the 413; an
unauthenticated client's body is never read). Then it reads the body
up to ``max_body_bytes`` and answers 413 in OpenAI's error shape beyond it (a chunked body
has no declared length), without keeping the excess in memory (it is read and dropped, up
to a hard cap, so the client sees the 413 instead of a reset socket).
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
# A refused request declaring more body than this gets its connection closed, so the server
# does not go on receiving (and discarding) it to keep the connection alive.
_KEEP_ALIVE_BODY_BYTES = 64 * 2**10
PUBLIC_PATHS = frozenset({"/health"})


class BodyLimitMiddleware:
    """Refuse, before reading any body, requests without the API key (401, except on
    ``public_paths``) and requests declaring more than ``max_body_bytes`` bytes (413); then
    answer 413 to a body that turns out larger."""

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 api_key: str | None = None, public_paths: frozenset[str] = PUBLIC_PATHS
                 ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key
        self.public_paths = public_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        declared = _content_length(headers)
        if self.api_key is not None and scope.get("path", "") not in self.public_paths:
            try:
                check_api_key(headers.get(b"authorization", b"").decode("latin-1") or None,
                              self.api_key)
            except APIError as exc:
                big = b"chunked" in headers.get(b"transfer-encoding", b"").lower() or \
                    (declared or 0) > _KEEP_ALIVE_BODY_BYTES
                await _send_json(send, 401, exc.body(), close=big,
                                 extra=[(b"www-authenticate", b"Bearer")])
                return
        if declared is not None and declared > self.max_body_bytes:
            if declared <= _DRAIN_CAP_BYTES and b"100-continue" not in \
                    headers.get(b"expect", b"").lower():
                # The client is sending it regardless: read and drop it first, since a socket
                # closed with unread data in it is reset, and the reset can destroy the 413
                # before the client reads it (seen as "peer closed connection without sending
                # complete message body" in httpx, under load).
                await _drain(receive, declared)
            await _send_json(send, 413, error_body(
                413, f"request body is {declared} bytes (Content-Length); the limit is "
                f"{self.max_body_bytes}", code="body_too_large"))
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


async def _drain(receive: Any, limit: int) -> None:
    """Receive and drop request body messages until the body ends, the client disconnects or
    more than ``limit`` bytes have arrived."""
    total = 0
    while total <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        total += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _headers(scope: dict) -> dict[bytes, bytes]:
    """The request's headers by lower-case name (the last of repeated ones)."""
    return {bytes(name).lower(): bytes(value) for name, value in scope.get("headers", [])}


def _content_length(headers: dict[bytes, bytes]) -> int | None:
    """The declared body length, or None (absent or malformed: the HTTP server refuses a
    malformed one itself; the body read below still bounds what arrives)."""
    value = headers.get(b"content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


async def _send_json(send: Any, status: int, body: dict, close: bool = True,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode()), *(extra or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
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
