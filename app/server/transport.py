"""The HTTP transports under ``RemoteEngine``: the standard library's ``http.client`` for a
``localchat serve`` found on this machine, ``httpx`` for any other endpoint.

A warm ``ask`` is a short process whose wall time is mostly start-up, so the path to a local
server must stay light: importing ``httpx`` (with ``httpcore``, ``anyio``, ``trio`` when
installed, and its command-line extras) and building its client (an SSL context loading the
CA bundle, even for ``http://``) were about half of that process's own CPU time. The
standard library's ``http.client`` imports in a fraction of that and opens a plain TCP
connection. Endpoints keep ``httpx``: proxies from the environment, TLS, redirects.

Both expose the same small surface: ``get(url)`` (body read), ``stream(method, url, json)``
(a context manager giving a response whose ``iter_lines()`` yields the body line by line),
responses with ``status_code`` / ``read()`` / ``json()``, and one exception,
``TransportError`` (``connect`` True when the server could not be reached at all).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any


class TransportError(Exception):
    """The request failed below HTTP: ``connect`` True when no connection was made
    (refused, unreachable, connect timeout), else the connection failed or closed mid-body.
    ``str()`` is the reason, one line."""

    def __init__(self, reason: str, *, connect: bool) -> None:
        super().__init__(reason)
        self.connect = connect


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class StdlibResponse:
    """An ``http.client`` response with the ``httpx.Response`` names ``RemoteEngine`` uses."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self.status_code: int = response.status
        self._body: bytes | None = None

    def read(self) -> bytes:
        import http.client

        if self._body is None:
            try:
                self._body = self._response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise TransportError(_reason(exc), connect=False) from None
        return self._body

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not."""
        return json.loads(self.read())

    def iter_lines(self) -> Iterator[str]:
        """The body's lines (UTF-8, without their ``\\n`` / ``\\r\\n``) as they arrive."""
        import http.client

        while True:
            try:
                line = self._response.readline()
            except (OSError, http.client.HTTPException) as exc:
                raise TransportError(_reason(exc), connect=False) from None
            if not line:
                return
            yield line.decode("utf-8", errors="replace").rstrip("\r\n")


class StdlibTransport:
    """One ``http.client`` connection per request (``http://`` or ``https://``).

    Args:
        headers: sent with every request (the bearer key).
        connect_timeout: seconds to establish the connection.
        read_timeout: seconds any one read may wait (a long prefill stays under it).
    """

    def __init__(self, headers: dict[str, str], connect_timeout: float,
                 read_timeout: float) -> None:
        self.headers = dict(headers)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def _connect(self, url: str, timeout: float | None) -> tuple[Any, str]:
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme == "https":
            import ssl

            conn: Any = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.connect_timeout,
                context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                              timeout=self.connect_timeout)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransportError(_reason(exc), connect=True) from None
        conn.sock.settimeout(timeout if timeout is not None else self.read_timeout)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return conn, path

    @contextlib.contextmanager
    def _open(self, method: str, url: str, body: Any = None, timeout: float | None = None
              ) -> Iterator[StdlibResponse]:
        import http.client

        conn, path = self._connect(url, timeout)
        try:
            headers = {**self.headers, "accept": "*/*"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["content-type"] = "application/json"
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise TransportError(_reason(exc), connect=False) from None
            yield StdlibResponse(response)
        finally:
            conn.close()

    def get(self, url: str, timeout: float | None = None) -> StdlibResponse:
        """``GET url``, the whole body read. Raises ``TransportError``."""
        with self._open("GET", url, timeout=timeout) as r:
            r.read()
            return r

    def stream(self, method: str, url: str, json: Any = None
               ) -> contextlib.AbstractContextManager[StdlibResponse]:
        """``method url`` with a JSON body; the body is read through ``iter_lines()`` inside
        the ``with`` block, and leaving it closes the connection (the server aborts the
        request). Raises ``TransportError``."""
        return self._open(method, url, json)

    def close(self) -> None:
        """Nothing held between requests."""


class _HttpxStreamed:
    """An ``httpx.Response`` whose reads raise ``TransportError``."""

    def __init__(self, response: Any, errors: Any) -> None:
        self._response = response
        self._errors = errors
        self.status_code: int = response.status_code

    def read(self) -> bytes:
        try:
            return self._response.read()
        except self._errors as exc:
            raise TransportError(_reason(exc), connect=False) from None

    def json(self) -> Any:
        return json.loads(self.read())

    def iter_lines(self) -> Iterator[str]:
        try:
            yield from self._response.iter_lines()
        except self._errors as exc:
            raise TransportError(_reason(exc), connect=False) from None


class HttpxTransport:
    """``httpx.Client`` (one pooled client; proxies from the environment, TLS). Same
    arguments as ``StdlibTransport``."""

    def __init__(self, headers: dict[str, str], connect_timeout: float,
                 read_timeout: float) -> None:
        import httpx

        self._httpx = httpx
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(
            read_timeout, connect=connect_timeout))

    def _error(self, exc: Exception) -> TransportError:
        return TransportError(_reason(exc), connect=isinstance(exc, self._httpx.ConnectError))

    def get(self, url: str, timeout: float | None = None) -> _HttpxStreamed:
        kwargs = {"timeout": timeout} if timeout is not None else {}
        try:
            response = self._client.get(url, **kwargs)
        except self._httpx.HTTPError as exc:
            raise self._error(exc) from None
        return _HttpxStreamed(response, self._httpx.HTTPError)

    @contextlib.contextmanager
    def stream(self, method: str, url: str, json: Any = None) -> Iterator[_HttpxStreamed]:
        try:
            with self._client.stream(method, url, json=json) as response:
                yield _HttpxStreamed(response, self._httpx.HTTPError)
        except self._httpx.HTTPError as exc:  # sending the request or closing it
            raise self._error(exc) from None

    def close(self) -> None:
        self._client.close()
