"""Request bodies of the OpenAI-compatible routes, validated strictly.

``parse_body`` turns raw bytes into a ``ChatCompletionRequest`` or ``CompletionRequest`` or
raises ``APIError(400)`` naming the field: bad JSON (too deeply nested included), text that
is not valid Unicode (a lone UTF-16 surrogate such as ``"\ud800"``), a wrong type (no silent
coercion: strict pydantic), an unknown field (a typo must not be ignored silently), a value
out of range or not finite, a ``null`` content in a user or system message. Ranges follow
the OpenAI API (penalties in [-2, 2], ``n`` = 1, ``top_logprobs`` <= 20, at most 16 stop
sequences) except ``temperature``, which takes the engine's range [0, 100] as vLLM and
llama-server do (OpenAI's is [0, 2]), so a request means the same with and without a
server; ``top_k``, ``min_p`` and ``repetition_penalty`` are the usual extensions (vLLM,
llama-server). Reference: the OpenAI API reference for
``/v1/chat/completions`` and ``/v1/completions``; vLLM's ``protocol.py`` (read, not copied).

Fields the OpenAI API defines fall in three sets (the README lists them):

- used: the sampling fields above, ``messages`` / ``prompt``, ``stream``, ...;
- accepted and ignored (``IGNORED_FIELDS``): they do not change what this server would
  generate (``user``, ``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls``,
  ``prompt_cache_key``, ...), or they are the "off" value of a feature we lack (``tools: []``,
  ``tool_choice: "none"``, ``response_format: {"type": "text"}``, ``logit_bias: {}``,
  ``modalities: ["text"]``); ``ignored_fields`` names the ones a request set, which the
  routes log at debug level;
- refused with 400 naming the field: a feature we cannot honour (``tools`` with a function,
  ``tool_choice`` other than ``none``, ``response_format`` other than ``text``, ``n`` or
  ``best_of`` > 1, a non-empty ``logit_bias``, ``audio``, ``functions``, ``suffix``, ...).

A name the OpenAI API does not define is refused too (400 ``unknown field``): unlike vLLM,
which logs and ignores it, we keep a misspelt ``max_token`` or ``temprature`` from being
silently dropped.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localchat.app.server.errors import APIError
from localchat.app.server.prompt_forms import check_prompt
from localchat.engine.sampling_params import MAX_STOP_STRINGS, MAX_TEMPERATURE, MAX_TOP_K

logger = logging.getLogger("localchat.server")

MAX_MESSAGES = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    """One part of a message's ``content`` list; only text parts are supported."""

    type: Literal["text"]
    text: str


def _off(value: Any, field: str, allowed: str) -> Any:
    """Refuse ``value`` unless it is the "feature off" value of ``field`` (None or empty)."""
    if value not in (None, [], {}):
        raise ValueError(f"'{field}' is not supported by this server (only {allowed})")
    return value


class ChatMessage(_Strict):
    """A chat message; ``developer`` is treated as ``system`` (OpenAI's newer name).
    ``content`` may be null or absent only in an assistant message (as in OpenAI's API).
    ``refusal`` is ignored; ``tool_calls`` must be empty (no tool support)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str | list[TextPart] | None, Field(validate_default=True)] = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[Any] | None = None

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: Any) -> Any:
        return _off(value, "tool_calls", "an empty list")

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") != "text":
                    raise ValueError(f"content part type {part.get('type')!r} is not "
                                     "supported (only 'text')")
        return value

    @field_validator("content")
    @classmethod
    def _content_unless_assistant(cls, value: Any, info: Any) -> Any:
        role = info.data.get("role")  # validated before content (field order)
        if value is None and role is not None and role != "assistant":
            raise ValueError(f"a {role} message needs 'content' (a string or a list of text "
                             "parts); only an assistant message may have null content")
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
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # -1 or 0: every token (vLLM's clients send -1 for "off")
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOP_K)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=100.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # OpenAI fields accepted and ignored (IGNORED_FIELDS), or refused unless "off".
    user: str | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: Any, info: Any) -> Any:
        """``stream_options`` without ``"stream": true`` would be ignored: refused, as OpenAI
        and vLLM refuse it (``stream`` is validated first; a bad one is its own error)."""
        if value is not None and info.data.get("stream") is not True:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: Any) -> Any:
        return _off(value, "logit_bias", "an empty object")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, value: Any) -> Any:
        """Say what is wrong with ``stop`` (pydantic's union error would name the string
        branch: "Input should be a valid string" for a list that is too long)."""
        if isinstance(value, list):
            if len(value) > MAX_STOP_STRINGS:
                raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed, "
                                 f"got {len(value)}")
            if any(not isinstance(s, str) for s in value):
                raise ValueError("'stop' must be a string or a list of strings")
        elif value is not None and not isinstance(value, str):
            raise ValueError("'stop' must be a string or a list of strings")
        return value

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
    """``POST /v1/chat/completions``; ``max_completion_tokens`` is the newer ``max_tokens``.
    See the module docstring for the fields accepted and ignored or refused."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Accepted and ignored: no effect on what this server generates.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    # Refused unless "off".
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: Any, info: Any) -> Any:
        return _off(value, info.field_name, "an empty list: no tool calling")

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _tool_choice_none(cls, value: Any, info: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError(f"'{info.field_name}' is not supported by this server "
                             "(only \"none\": no tool calling)")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, value: Any) -> Any:
        if value is not None and value != {"type": "text"}:
            raise ValueError("'response_format' is not supported by this server (only "
                             "{\"type\": \"text\"})")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if value not in (None, ["text"]):
            raise ValueError("'modalities' is not supported by this server (only [\"text\"])")
        return value

    @field_validator("audio", "web_search_options")
    @classmethod
    def _absent(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(f"'{info.field_name}' is not supported by this server")
        return value


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a one-string list or token ids."""

    prompt: (str | Annotated[list[str], Field(min_length=1, max_length=1)]
             | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)])
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] | None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        check_prompt(value)
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        if value:
            raise ValueError("'suffix' is not supported by this server (no insertion)")
        return value


# Fields a request may set that change nothing here (logged at debug by the routes). The
# "off" values of refused features (``tools: []``, ``tool_choice: "none"``, ...) are too.
IGNORED_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
    "safety_identifier", "reasoning_effort", "verbosity", "prediction", "tools",
    "tool_choice", "functions", "function_call", "response_format", "modalities",
    "logit_bias", "best_of", "suffix"})


def ignored_fields(body: BaseModel) -> list[str]:
    """The fields of ``IGNORED_FIELDS`` that the request set, sorted (for a debug log)."""
    return sorted(IGNORED_FIELDS & body.model_fields_set)


def parse_body(raw: bytes, model_cls: type[_Strict]) -> Any:
    """Validate a JSON request body. Whatever the bytes, the answer is the model or a 400:
    no exception from parsing or validation escapes as a 500.

    Raises:
        APIError: 400 with ``param`` = the offending field's dotted path (``invalid_json``
            for bytes that are not a JSON object).
    """
    data = _load_json(raw)
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_json")
    bad = _surrogate_path(data)
    if bad is not None:
        where = ".".join(str(p) for p in bad)
        raise APIError(400, f"'{where}' is not valid Unicode text: it holds a lone UTF-16 "
                       "surrogate (\\ud800-\\udfff)", param=where or None,
                       code="invalid_value")
    try:
        return model_cls.model_validate(data)
    except RecursionError:
        raise APIError(400, "the body nests too deeply", code="invalid_json") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in _useful_loc(err.get("loc", ())))
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            message = f"unknown field '{loc}'"
        elif kind == "missing":
            message = f"missing required field '{loc}'"
        else:
            text = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
            message = text if text.startswith(f"'{loc}'") else f"'{loc}': {text}"
        raise APIError(400, message, param=loc or None, code="invalid_value") from None
    except Exception as exc:  # noqa: BLE001 - a validator's bug is still the body's 400
        logger.error("request validation failed: %s: %s", type(exc).__name__, exc)
        raise APIError(400, f"the body could not be validated ({type(exc).__name__})",
                       code="invalid_value") from None


def _load_json(raw: bytes) -> Any:
    """``json.loads(raw)``, every failure as a 400 ``invalid_json``: a syntax error, bytes
    that are not UTF-8/16/32, nesting deeper than the parser's recursion limit, an integer
    over Python's digit limit (a ``ValueError``), anything else."""
    try:
        return json.loads(raw)
    except RecursionError:
        message = "it nests too deeply"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        message = str(exc).partition(";")[0].splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - bytes from the network never make a 500
        message = type(exc).__name__
    raise APIError(400, f"the body is not valid JSON: {message}", code="invalid_json")


def _surrogate_path(data: Any) -> list[Any] | None:
    """The path (keys and indices) of the first string in ``data``, key or value, that
    holds a lone surrogate (JSON's ``"\\ud800"`` decodes to one; UTF-8 cannot encode it and
    the tokenizer refuses it), or None. Iterative: nesting depth costs no stack."""
    stack: list[tuple[list[Any], Any]] = [([], data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path
        elif isinstance(value, dict):
            items = list(value.items())
            for key, item in reversed(items):
                if not _is_unicode(key):
                    return [*path, key.encode("utf-8", "backslashreplace").decode()]
                stack.append(([*path, key], item))
        elif isinstance(value, list):
            stack.extend(([*path, i], item) for i, item in reversed(list(enumerate(value))))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
