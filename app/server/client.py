"""A streaming client for any OpenAI-compatible server, shaped like the engine.

``RemoteEngine.generate(messages, sampling)`` yields ``RemoteOutput``s with the fields
``ask`` and ``chat --jsonl`` read from a ``RequestOutput`` (``text_delta``, ``text``,
``finished``, ``finish_reason``, token counts, ``metrics.ttft``), so the same writers, history
and ``--json`` / ``--stats`` reports work over HTTP. The conversation stays the client's: each
turn sends the whole history as ``messages`` (a ``localchat serve`` reuses the earlier turns
from its prefix cache). Closing the iterator closes the connection, which aborts the request.
Errors are ``BackendError`` (one line): unreachable server, an HTTP error (the server's own
message), or a connection lost mid-reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from localchat.engine.errors import LocalchatError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0


class BackendError(LocalchatError):
    """The OpenAI-compatible backend failed (unreachable, refused, or gone mid-reply).

    ``refused``: the server answered the request with a 4xx status (the request itself was
    turned down, e.g. a prompt too long for its context), not a transport or server failure.
    """

    refused = False


@dataclass
class RemoteMetrics:
    """Client-side timings (``time.perf_counter`` seconds), read by ``report.answer_stats``."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - \
            self.arrival_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        return self.last_token_time - self.first_token_time

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over first -> last token (the engine's definition,
        ``RequestMetrics.decode_tokens_per_s``); None until the server reports the count."""
        elapsed = self.decode_time
        if not elapsed or self.num_output_tokens < 2:
            return None
        return (self.num_output_tokens - 1) / elapsed


@dataclass
class RemoteOutput:
    """One streamed chunk, with the same names as ``engine.outputs.RequestOutput``."""

    text_delta: str
    text: str
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None  # None: the server sent no usage
    num_output_tokens: int | None = None
    num_cached_tokens: int | None = None
    metrics: RemoteMetrics | None = None
    new_token_ids: list[int] = field(default_factory=list)


class RemoteEngine:
    """An OpenAI-compatible server as the backend.

    Args:
        base_url: the server's root (``http://127.0.0.1:8088``) or its ``/v1`` URL.
        api_key: bearer key, or None.
        model: the model id to request; None asks ``/v1/models`` for the first one.
        local_server: True for a ``localchat serve`` found through its state file.
    """

    remote = True

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 *, local_server: bool = False) -> None:
        from localchat.app.server.transport import HttpxTransport, StdlibTransport

        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.local_server = local_server
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # A server on this machine: the standard library's http.client keeps a warm ``ask``
        # free of httpx's imports and SSL set-up (``transport.py``).
        transport = StdlibTransport if local_server else HttpxTransport
        self._http = transport(headers, CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        self._cards: list[dict[str, Any]] | None = None  # /v1/models, once read
        self.model = model or self._first_model()

    # -- discovery ------------------------------------------------------------------------

    def list_models(self) -> list[str]:
        """The ids ``/v1/models`` lists."""
        doc = self._get_json("/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        self._cards = [m for m in (data or []) if isinstance(m, dict)]
        return [str(m.get("id")) for m in self._cards]

    def server_context(self) -> int | None:
        """The server's context size (prompt + reply, in tokens) for ``self.model``, as its
        ``/v1/models`` entry reports it in ``max_model_len`` (vLLM and ``localchat serve`` do;
        OpenAI's API does not): None when it does not say, or cannot be asked now. Reads
        ``/v1/models`` at most once; never raises."""
        if self._cards is None:
            try:
                self.list_models()
            except (BackendError, AttributeError, TypeError):
                self._cards = []
        card = next((m for m in self._cards or [] if str(m.get("id")) == self.model), None)
        value = card.get("max_model_len") if card else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            else None

    def _first_model(self) -> str:
        ids = self.list_models()
        if not ids:
            raise BackendError(f"{self.base_url}/models lists no model; name one with -m")
        return ids[0]

    def _get_json(self, path: str) -> dict[str, Any]:
        from localchat.app.server.transport import TransportError

        try:
            r = self._http.get(self.base_url + path)
        except TransportError as exc:
            raise BackendError(f"cannot reach {self.base_url}: {_reason(exc)}") from None
        _raise_for_status(r, self.base_url + path)
        try:
            return r.json()
        except ValueError:
            raise BackendError(f"{self.base_url}{path} did not answer JSON") from None

    # -- generation -----------------------------------------------------------------------

    def generate(self, messages: list[dict[str, str]], sampling: Any
                 ) -> Iterator[RemoteOutput]:
        """Stream one reply to ``messages`` (``[{"role", "content"}]``) decoded with
        ``sampling`` (a ``SamplingParams``). Raises ``BackendError``."""
        from localchat.app.server.transport import TransportError

        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **request_fields(sampling)}
        metrics = RemoteMetrics(arrival_time=time.perf_counter())
        url = self.base_url + "/chat/completions"
        reply = ReplyText(sampling, metrics)
        reason: str | None = None
        other: list[str] = []  # lines that are no event (a server that ignored "stream")
        events = 0
        try:
            with self._http.stream("POST", url, json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for_status(r, url)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        if not events and len(other) < 10_000:
                            other.append(line)
                        continue
                    events += 1
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = _chunk(data, url)
                    usage = chunk.get("usage")
                    delta, finish = _choice(chunk)
                    if delta:
                        out = reply.feed(delta)
                        if out is not None:
                            yield out
                        if reply.stopped:  # leaving closes the stream: the server stops
                            yield from reply.finish(None)
                            return
                    reason = finish or reason
                    if usage:
                        yield from reply.finish(reason, usage)
                        return
                if not events:  # one JSON completion instead of an event stream
                    yield _whole_reply("\n".join(other), url, metrics, sampling)
                    return
                if reason is None:
                    raise BackendError(f"the server at {self.base_url} closed the stream "
                                       "before the reply ended")
                yield from reply.finish(reason)
        except TransportError as exc:
            raise stream_error(self.base_url, exc) from None

    def close(self) -> None:
        self._http.close()


class ReplyText:
    """The client side of one streamed reply: its text so far and, when ``sampling.stop`` is
    set, the stop strings applied here as well (``engine.stop_strings``; a server that ignores
    ``stop`` must not make ``ask`` print past a stop string, which the README promises it
    never shows). Shared by the sync and async clients.

    ``feed(delta)`` returns the ``RemoteOutput`` to yield now (``None`` when the text is held
    back as a possible stop's start, or empty); ``stopped`` turns True once a stop string
    matched, after which the caller ends the reply with ``finish``. ``finish(reason, usage)``
    yields the held text, if any, then the final output (reason ``"stop"`` after a match).
    """

    def __init__(self, sampling: Any, metrics: RemoteMetrics) -> None:
        from localchat.engine.stop_strings import StopStringMatcher

        stops = list(getattr(sampling, "stop", None) or ())
        self._stops = StopStringMatcher(stops) if stops else None
        self.metrics = metrics
        self.text: list[str] = []
        self.stopped = False

    def feed(self, delta: str) -> RemoteOutput | None:
        now = time.perf_counter()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.last_token_time = now
        if self._stops is not None:
            delta, matched = self._stops.feed(delta)
            self.stopped = matched is not None
        return self._out(delta)

    def finish(self, reason: str | None, usage: dict | None = None) -> Iterator[RemoteOutput]:
        if self._stops is not None:
            held = self._stops.flush()
            if self._stops.matched is not None:
                self.stopped = True
            out = self._out(held)
            if out is not None:
                yield out
        yield _final(self.text, "stop" if self.stopped else reason, usage, self.metrics)

    def _out(self, delta: str) -> RemoteOutput | None:
        if not delta:
            return None
        self.text.append(delta)
        return RemoteOutput(delta, "".join(self.text), metrics=self.metrics)


def request_fields(sampling: Any) -> dict[str, Any]:
    """OpenAI request fields for a ``SamplingParams`` (extensions only when not default)."""
    fields: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.max_tokens is not None:
        fields["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(sampling, name):
            fields[name] = getattr(sampling, name)
    if sampling.top_k:
        fields["top_k"] = sampling.top_k
    if sampling.min_p:
        fields["min_p"] = sampling.min_p
    if sampling.repetition_penalty != 1.0:
        fields["repetition_penalty"] = sampling.repetition_penalty
    return fields


def _final(text: list[str], reason: str | None, usage: dict | None,
           metrics: RemoteMetrics) -> RemoteOutput:
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    out = RemoteOutput("", "".join(text), finished=True, finish_reason=reason or "stop",
                       num_prompt_tokens=_count(usage.get("prompt_tokens")),
                       num_output_tokens=_count(usage.get("completion_tokens")),
                       num_cached_tokens=details.get("cached_tokens"), metrics=metrics)
    metrics.num_output_tokens = out.num_output_tokens or 0
    return out


def _count(value: Any) -> int | None:
    """A usage token count, or None when the server did not send a usable one."""
    return int(value) if isinstance(value, (int, float)) and value >= 0 else None


def _whole_reply(body: str, url: str, metrics: RemoteMetrics, sampling: Any) -> RemoteOutput:
    """The reply of a server that answered a streaming request with one chat completion
    object (it ignored ``"stream": true``), cut at a stop string of ``sampling`` as
    :class:`ReplyText` cuts a stream. Raises ``BackendError`` for anything else."""
    try:
        doc = json.loads(body)
        message = doc["choices"][0]["message"]
        content = message.get("content") or ""
        reason = doc["choices"][0].get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise BackendError(f"{url} answered neither an event stream nor a chat completion") \
            from None
    if not isinstance(content, str):
        raise BackendError(f"{url} answered a chat completion without text content")
    reply = ReplyText(sampling, metrics)
    shown = reply.feed(content)
    final = list(reply.finish(reason, doc.get("usage")))
    out = final[-1]
    out.text_delta = "".join(o.text_delta for o in ([shown] if shown else []) + final[:-1])
    return out


def _chunk(data: str, url: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise BackendError(f"{url} sent an event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise BackendError(f"{url} sent an event that is not a JSON object")
    if "error" in chunk:
        err = chunk["error"]
        message = err.get("message") if isinstance(err, dict) else err
        raise BackendError(f"the server failed mid-reply: {message}")
    return chunk


def _choice(chunk: dict[str, Any]) -> tuple[str, str | None]:
    choices = chunk.get("choices") or []
    if not choices:
        return "", None
    choice = choices[0]
    delta = (choice.get("delta") or {}).get("content") or ""
    return delta, choice.get("finish_reason")


def _raise_for_status(r: Any, url: str) -> None:
    if r.status_code < 400:
        return
    message = None
    try:
        err = r.json().get("error")
        message = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        pass
    err = BackendError(f"{url} answered {r.status_code}"
                       + (f": {' '.join(str(message).split())}" if message else ""))
    err.refused = 400 <= r.status_code < 500
    raise err


def stream_error(base_url: str, exc: Exception) -> BackendError:
    """The one-line ``BackendError`` for a transport error (``transport.TransportError``, or
    an ``httpx`` error in the async client) while streaming from ``base_url``: unreachable
    (no connection made), else stopped mid-reply. Shared by the sync and async clients."""
    from localchat.app.server.transport import TransportError

    if isinstance(exc, TransportError):
        connect = exc.connect
    else:
        import httpx

        connect = isinstance(exc, httpx.ConnectError)
    if connect:
        return BackendError(f"cannot reach {base_url}: {_reason(exc)}")
    return BackendError(f"the server at {base_url} stopped mid-reply: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
