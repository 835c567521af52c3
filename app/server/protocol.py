"""Request bodies of the OpenAI-compatible routes, validated strictly.

``parse_body`` turns raw bytes into a ``ChatCompletionRequest`` or ``CompletionRequest`` or
raises ``APIError(400)`` naming the field: bad JSON, a wrong type (no silent coercion: strict
pydantic), an unknown field (a typo must not be ignored silently), a value out of range.
Ranges follow the OpenAI API (``temperature`` in [0, 2], penalties in [-2, 2], ``n`` = 1,
``top_logprobs`` <= 20); ``top_k``, ``min_p`` and ``repetition_penalty`` are the usual
extensions (vLLM, llama-server). Reference: the OpenAI API reference for
``/v1/chat/completions`` and ``/v1/completions``; vLLM's ``protocol.py`` (read, not copied).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localchat.app.server.errors import APIError

MAX_STOP_STRINGS = 16
MAX_MESSAGES = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    """One part of a message's ``content`` list; only text parts are supported."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """A chat message; ``developer`` is treated as ``system`` (OpenAI's newer name)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") != "text":
                    raise ValueError(f"content part type {part.get('type')!r} is not "
                                     "supported (only 'text')")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _SamplingFields(_Strict):
    """Fields both routes share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=100.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in items):
            raise ValueError("stop strings must be non-empty")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` is the newer ``max_tokens``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a one-string list or token ids."""

    prompt: (str | Annotated[list[str], Field(min_length=1, max_length=1)]
             | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)])
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] | None = None


def parse_body(raw: bytes, model_cls: type[_Strict]) -> Any:
    """Validate a JSON request body.

    Raises:
        APIError: 400 with ``param`` = the offending field's dotted path.
    """
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_json")
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in _useful_loc(err.get("loc", ())))
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            message = f"unknown field '{loc}'"
        elif kind == "missing":
            message = f"missing required field '{loc}'"
        else:
            message = f"'{loc}': {err.get('msg', 'invalid value')}"
        raise APIError(400, message, param=loc or None, code="invalid_value") from None


def _useful_loc(loc: tuple[Any, ...]) -> list[Any]:
    """Drop pydantic's union-branch labels (``str``, ``list[...]``) from an error location."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part in ("str", "int", "float", "bool")
                                       or part.startswith(("list[", "function-", "constrained-",
                                                           "literal["))):
            continue
        out.append(part)
    return out
