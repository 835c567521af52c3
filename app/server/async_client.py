"""The TUI's backend over HTTP: ``AsyncRemoteEngine``, an OpenAI-compatible server shaped like
``AsyncLLMEngine`` (``generate`` is an async iterator; closing it closes the connection, which
aborts the request on the server).

The TUI renders messages, not token ids, for it (``remote`` is True and ``tokenizer`` None):
the server applies its own chat template. ``get_stats()`` returns the latest ``/health``
snapshot the engine fetched after a reply (no network call on the UI thread).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from localchat.app.server.client import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    BackendError,
    RemoteMetrics,
    RemoteOutput,
    ReplyText,
    _choice,
    _chunk,
    _raise_for_status,
    _reason,
    request_fields,
    stream_error,
)
from localchat.app.server.encode import engine_info_from_json
from localchat.engine.outputs import EngineInfo


@dataclass
class RemoteStats:
    """What a ``localchat serve`` ``/health`` reports, with ``EngineStats``' names (zeros for
    other servers)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    max_model_len: int | None = None
    num_blocks: int = 0
    block_size: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec: Any = None
    prefix_cache_hit_rate: float = 0.0


class AsyncRemoteEngine:
    """See the module docstring. ``base_url`` is the server root or its ``/v1`` URL."""

    remote = True
    tokenizer = None

    def __init__(self, base_url: str, api_key: str | None, model: str,
                 max_model_len: int | None = None) -> None:
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.root_url = self.base_url[: -len("/v1")]
        self.model = model
        self.max_model_len = max_model_len
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._stats = RemoteStats(max_model_len=max_model_len)
        self._engine_doc: Any = None  # /health's ``engine`` object (a localchat serve)
        self._client: Any = None

    def _http(self) -> Any:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(
                READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        return self._client

    async def generate(self, messages: list[dict[str, str]], sampling: Any,
                       request_id: str | None = None) -> AsyncIterator[RemoteOutput]:
        """Stream one reply; raises ``BackendError`` (one line)."""
        import httpx

        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **request_fields(sampling)}
        metrics = RemoteMetrics(arrival_time=time.perf_counter())
        url = self.base_url + "/chat/completions"
        reply = ReplyText(sampling, metrics)
        reason: str | None = None
        try:
            async with self._http().stream("POST", url, json=body) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for_status(r, url)
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = _chunk(data, url)
                    delta, finish = _choice(chunk)
                    if delta:
                        out = reply.feed(delta)
                        if out is not None:
                            yield out
                        if reply.stopped:  # leaving closes the stream: the server stops
                            for out in reply.finish(None):
                                yield out
                            return
                    reason = finish or reason
                    if chunk.get("usage"):
                        await self._refresh_stats()
                        for out in reply.finish(reason, chunk["usage"]):
                            yield out
                        return
            if reason is None:
                raise BackendError(f"the server at {self.base_url} closed the stream before "
                                   "the reply ended")
            for out in reply.finish(reason):
                yield out
        except httpx.HTTPError as exc:
            raise stream_error(self.base_url, exc) from None

    async def _refresh_stats(self) -> None:
        import httpx

        try:
            doc = (await self._http().get(self.root_url + "/health", timeout=2.0)).json()
        except (httpx.HTTPError, ValueError):
            return
        if isinstance(doc, dict):
            self._engine_doc = doc.get("engine", self._engine_doc)
            self._stats = RemoteStats(
                num_running=int(doc.get("running") or 0),
                num_waiting=int(doc.get("waiting") or 0),
                kv_cache_usage=float(doc.get("kv_cache_usage") or 0.0),
                max_model_len=doc.get("max_model_len") or self.max_model_len)

    async def list_models(self) -> list[dict[str, Any]]:
        """The model cards ``/v1/models`` lists (dicts with at least ``id``; a ``localchat
        serve`` adds ``max_model_len``), in the server's order.

        Raises:
            BackendError: the server cannot be reached, refuses, or does not answer JSON.
        """
        import httpx

        url = self.base_url + "/models"
        try:
            r = await self._http().get(url)
        except httpx.HTTPError as exc:
            raise BackendError(f"cannot reach {self.base_url}: {_reason(exc)}") from None
        _raise_for_status(r, url)
        try:
            doc = r.json()
        except ValueError:
            raise BackendError(f"{url} did not answer JSON") from None
        data = doc.get("data") if isinstance(doc, dict) else None
        return [m for m in (data or []) if isinstance(m, dict) and m.get("id")]

    def get_stats(self) -> RemoteStats:
        return self._stats

    def get_info(self) -> EngineInfo:
        """The server's ``EngineInfo``: what a ``localchat serve`` reports in ``/health``'s
        ``engine`` object (fetched by :func:`connect` and after each reply, never on the UI
        thread), else only the model and ``max_model_len`` from ``/v1/models`` (the rest
        unknown: see ``EngineInfo``)."""
        return engine_info_from_json(self._engine_doc, self.model, self.max_model_len)

    def abort(self, request_id: str) -> None:
        """Nothing to do: closing the stream aborts the request on the server."""

    def shutdown(self, timeout: float = 2.0) -> None:
        client, self._client = self._client, None
        if client is not None:
            import asyncio
            import contextlib

            with contextlib.suppress(Exception):
                loop = asyncio.get_running_loop()
                loop.create_task(client.aclose())

    @property
    def is_running(self) -> bool:
        return True


def connect(base_url: str, api_key: str | None, model: str | None) -> AsyncRemoteEngine:
    """An ``AsyncRemoteEngine`` on ``base_url`` for ``model`` when ``/v1/models`` lists it,
    else for the first model listed (with its ``max_model_len`` when the server reports one).

    Raises:
        BackendError: the server cannot be reached or lists no model.
    """
    from localchat.app.server.client import RemoteEngine

    sync = RemoteEngine(base_url, api_key, model="-")  # no request until asked
    try:
        doc = sync._get_json("/models")
    finally:
        sync.close()
    cards = [m for m in doc.get("data", []) if isinstance(m, dict) and m.get("id")]
    if not cards:
        raise BackendError(f"{sync.base_url}/models lists no model")
    card = next((m for m in cards if m["id"] == model), cards[0])
    engine = AsyncRemoteEngine(base_url, api_key, str(card["id"]), card.get("max_model_len"))
    engine._engine_doc = _health_engine(engine.root_url, api_key)
    return engine


def _health_engine(root_url: str, api_key: str | None) -> Any:
    """``/health``'s ``engine`` object, or None (another server, or no answer in 2 s)."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        doc = httpx.get(root_url + "/health", headers=headers, timeout=2.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    return doc.get("engine") if isinstance(doc, dict) else None
