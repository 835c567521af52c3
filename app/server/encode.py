"""From validated requests to ``SamplingParams``, and from ``RequestOutput``s to OpenAI
response objects (whole bodies and server-sent-event chunks).

Shapes follow the OpenAI API: ``chat.completion`` / ``chat.completion.chunk`` (choices with
``message`` or ``delta``, ``logprobs.content[]`` with ``token``, ``logprob``, ``bytes``,
``top_logprobs``), ``text_completion`` (legacy ``logprobs``: ``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``), ``usage`` with ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from localchat.app.server.text_offsets import TextOffsets
from localchat.engine.outputs import EngineInfo
from localchat.engine.sampling_params import SamplingParams

# OpenAI's default temperature (1.0) applies when a request names none.
DEFAULT_TEMPERATURE = 1.0


def sampling_params(body: Any, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """``SamplingParams`` for a validated chat or completion request (ranges already checked
    against OpenAI's, which sit inside the engine's)."""
    def pick(name: str, default: Any) -> Any:
        value = getattr(body, name, None)
        return default if value is None else value

    return SamplingParams(
        temperature=pick("temperature", DEFAULT_TEMPERATURE), top_p=pick("top_p", 1.0),
        top_k=max(pick("top_k", 0), 0), min_p=pick("min_p", 0.0),  # -1: every token, as 0
        repetition_penalty=pick("repetition_penalty", 1.0), seed=body.seed,
        max_tokens=max_tokens, presence_penalty=pick("presence_penalty", 0.0),
        frequency_penalty=pick("frequency_penalty", 0.0), stop=body.stop_strings(),
        logprobs=logprobs)


def model_card(model_id: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "localchat",
            "max_model_len": max_model_len}



# ``/health``'s ``engine`` object (a localchat extension): ``EngineInfo`` as JSON, and back.
_INFO_INTS = ("max_model_len", "num_blocks", "block_size", "kv_cache_bytes", "num_spec_tokens")


def engine_info_json(info: EngineInfo) -> dict[str, Any]:
    """``info`` as JSON fields (dtype and device by name: ``"float32"``, ``"cpu"``)."""
    return {"model": info.model, "weight_format": info.weight_format,
            "dtype": None if info.dtype is None else str(info.dtype).removeprefix("torch."),
            "device": None if info.device is None else str(info.device),
            "max_model_len": info.max_model_len, "num_blocks": info.num_blocks,
            "block_size": info.block_size, "kv_cache_bytes": info.kv_cache_bytes,
            "quant_group_size": info.quant_group_size, "draft": info.draft,
            "num_spec_tokens": info.num_spec_tokens, "allocated_bytes": info.allocated_bytes}


def engine_info_from_json(doc: Any, model: str, max_model_len: int | None) -> EngineInfo:
    """The ``EngineInfo`` a server reports in ``doc`` (``engine_info_json``'s fields); a
    server that reports none (not a ``localchat serve``) or a malformed field leaves that
    field unknown: ``None``, or 0 for the KV pool's figures, with ``model`` and
    ``max_model_len`` (from ``/v1/models``) as given."""
    doc = doc if isinstance(doc, dict) else {}

    def integer(name: str, default: int | None = 0) -> int | None:
        value = doc.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def text(name: str) -> str | None:
        value = doc.get(name)
        return value if isinstance(value, str) and value else None

    import torch

    dtype = getattr(torch, text("dtype") or "", None)
    try:
        device = torch.device(text("device")) if text("device") else None
    except (RuntimeError, ValueError):
        device = None
    ints = {name: integer(name) for name in _INFO_INTS}
    ints["max_model_len"] = integer("max_model_len", max_model_len or 0)
    return EngineInfo(model=text("model") or model, weight_format=text("weight_format"),
                      dtype=dtype if isinstance(dtype, torch.dtype) else None, device=device,
                      quant_group_size=integer("quant_group_size", None), draft=text("draft"),
                      allocated_bytes=integer("allocated_bytes", None), **ints)


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def finish_reason(out: Any) -> str | None:
    if not out.finished or out.finish_reason is None:
        return None
    value = getattr(out.finish_reason, "value", out.finish_reason)
    return "length" if value == "length" else "stop"


def usage(out: Any) -> dict[str, Any]:
    prompt, completion = out.num_prompt_tokens, out.num_output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens}}


@dataclass
class ResponseShape:
    """Builds one request's response objects. ``kind`` is ``chat`` or ``text``. The legacy
    ``text_offset`` is each token's start in the returned text (``text_offsets.py``); a
    stream's continues across chunks (``_stream_chars``: the text sent so far), as in the
    whole body."""

    kind: str
    request_id: str
    model: str
    created: int
    tokenizer: Any
    top_n: int | None  # logprobs asked for: the top-n size (0: the sampled token only)
    _stream_chars: int = field(default=0, init=False)
    _stream_offsets: TextOffsets | None = field(default=None, init=False)

    def _base(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model}

    # -- whole body -------------------------------------------------------------------------

    def whole(self, outputs: list[Any]) -> dict[str, Any]:
        last = outputs[-1]
        text = "".join(o.text_delta for o in outputs)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(last)}
        logprobs = self._logprobs(outputs) if self.top_n is not None else None
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = {"content": logprobs} if logprobs is not None else None
        else:
            choice["text"] = text
            choice["logprobs"] = None
            if logprobs is not None:
                offsets = TextOffsets(self.tokenizer).take(_logprob_ids(outputs), len(text))
                choice["logprobs"] = self._legacy(logprobs, offsets)
        return {**self._base(False), "choices": [choice], "usage": usage(last)}

    # -- stream -----------------------------------------------------------------------------

    def opening(self) -> list[dict[str, Any]]:
        """The role chunk that starts a chat stream (none for completions)."""
        if self.kind != "chat":
            return []
        return [{**self._base(True), "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}]}]

    def delta(self, out: Any) -> list[dict[str, Any]]:
        """Chunks for one ``RequestOutput``: its text (when any) and its finish reason."""
        reason = finish_reason(out)
        logprobs = self._logprobs([out]) if self.top_n is not None else None
        if not out.text_delta and reason is None and not logprobs:
            return []
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if self.kind == "chat":
            choice["delta"] = {"content": out.text_delta} if out.text_delta else {}
            choice["logprobs"] = {"content": logprobs} if logprobs else None
        else:
            choice["text"] = out.text_delta
            choice["logprobs"] = None
            self._stream_chars += len(out.text_delta)
            if logprobs:
                if self._stream_offsets is None:
                    self._stream_offsets = TextOffsets(self.tokenizer)
                offsets = self._stream_offsets.take(_logprob_ids([out]), self._stream_chars)
                choice["logprobs"] = self._legacy(logprobs, offsets)
        return [{**self._base(True), "choices": [choice]}]

    def usage_chunk(self, last: Any) -> dict[str, Any]:
        """The final chunk of ``stream_options.include_usage``: no choices, the usage."""
        return {**self._base(True), "choices": [], "usage": usage(last)}

    # -- logprobs ---------------------------------------------------------------------------

    def _token(self, token_id: int) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, outputs: list[Any]) -> list[dict[str, Any]]:
        """``logprobs.content`` entries: each generated token with its logprob and the
        request's top-n (the engine returns the top n ids plus the sampled one)."""
        entries = []
        for out in outputs:
            for token_id, top in zip(out.new_token_ids, out.logprobs or []):
                ranked = sorted(top.items(), key=lambda kv: -kv[1])[: self.top_n or 0]
                entries.append({
                    **self._token(token_id), "logprob": float(top[token_id]),
                    "top_logprobs": [{**self._token(t), "logprob": float(lp)}
                                     for t, lp in ranked]})
        return entries

    @staticmethod
    def _legacy(entries: list[dict[str, Any]], offsets: list[int]) -> dict[str, Any]:
        """The legacy ``logprobs`` object of ``entries`` (``_logprobs``), whose tokens start
        at ``offsets`` in the text."""
        return {"tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                                 for e in entries],
                "text_offset": offsets}


def _logprob_ids(outputs: list[Any]) -> list[int]:
    """The token ids ``_logprobs`` makes entries of, in order."""
    return [t for out in outputs for t, _ in zip(out.new_token_ids, out.logprobs or [])]
