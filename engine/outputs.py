"""What leaves the engine. torch is not imported here (the CLI imports these types early)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .request import FinishReason

if TYPE_CHECKING:
    import torch

_FLOAT_FORMATS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def float_format(dtype: torch.dtype) -> str:
    """The weight-format name of an unquantized ``dtype``: "fp32", "bf16", "fp16" (else the
    dtype's own name without ``torch.``)."""
    name = str(dtype).removeprefix("torch.")
    return _FLOAT_FORMATS.get(name, name)


@dataclass
class ModelRunnerOutput:
    """What one model step produced, as plain values (the runner mutates no ``Request``; the
    scheduler applies this in ``Scheduler.update_from_output``). vLLM v1's
    ``ModelRunnerOutput``, keyed by request id.

    ``sampled_token_ids``: request id -> the new token ids of each request that sampled: one,
    or for a request verifying k drafts the accepted drafts plus one target token (1 to
    k + 1). ``num_accepted_tokens``: request id -> drafts accepted, for requests that verified
    drafts. ``logprobs``: request id -> one ``{token_id: logprob}`` per sampled token, for
    requests with ``sampling_params.logprobs`` set.
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    num_accepted_tokens: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineInfo:
    """What a loaded engine is: fixed from load to shutdown (``LLMEngine.get_info()``).

    ``model`` / ``draft``: the checkpoint names (file or folder name; ``draft`` None without
    speculative decoding). ``weight_format``: the loaded decoder weights' format, a quantized
    scheme ("int8", "int4", "fp8") or the float format of ``dtype`` ("fp32", "bf16", "fp16");
    ``quant_group_size`` the int4 group size (None otherwise). ``dtype``: activations and KV
    cache. KV pool: ``num_blocks`` blocks of ``block_size`` tokens, ``kv_cache_bytes`` the bytes
    the engine allocated for them (K and V, all layers). ``max_model_len``: prompt + reply, in
    tokens. ``num_spec_tokens``: the largest draft length per step (0 without a draft).
    ``allocated_bytes``: bytes of the distinct storages the target model and its KV pool hold
    (weights, buffers, quantized layouts, KV cache), and the draft model's and its pool's
    where there is one, or None
    where the engine cannot count them. A remote engine (``AsyncRemoteEngine.get_info``) fills
    the fields from what its server reports; what a server does not report is None
    (``weight_format``, ``dtype``, ``device``) or 0 (the KV pool's figures). A local engine
    always sets them.
    """

    model: str
    weight_format: str | None
    dtype: torch.dtype | None
    device: torch.device | None
    max_model_len: int
    num_blocks: int
    block_size: int
    kv_cache_bytes: int
    quant_group_size: int | None = None
    draft: str | None = None
    num_spec_tokens: int = 0
    allocated_bytes: int | None = None

    @property
    def is_quantized(self) -> bool:
        return (self.weight_format is not None
                and self.weight_format not in _FLOAT_FORMATS.values())


@dataclass
class RequestMetrics:
    """Per-request timings in seconds (``time.perf_counter`` clock) and token counts.

    ``queue_time``: arrival to first scheduled. ``ttft``: arrival to first generated token.
    ``prefill_tokens_per_s``: prompt tokens actually computed (not from the prefix cache)
    over first scheduled -> first token. ``decode_tokens_per_s``: tokens after the first over
    first token -> latest token. Each is ``None`` until its timestamps exist.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    # Speculative decoding: draft tokens verified and accepted for this request.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        return self.last_token_time - self.first_token_time

    @property
    def prefill_tokens_per_s(self) -> float | None:
        if self.first_token_time is None or self.first_scheduled_time is None:
            return None
        elapsed = self.first_token_time - self.first_scheduled_time
        computed = self.num_prompt_tokens - self.num_cached_tokens
        return computed / elapsed if elapsed > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        elapsed = self.decode_time
        if not elapsed or self.num_output_tokens < 2:
            return None
        return (self.num_output_tokens - 1) / elapsed


@dataclass
class EngineStats:
    """A snapshot of the engine: queue sizes, KV pool use and prefix-cache effectiveness.

    ``kv_cache_usage`` is the fraction of KV blocks held by requests, in [0, 1];
    ``prefix_cache_hit_rate`` is cached tokens / looked-up prompt tokens since start.
    """

    num_running: int
    num_waiting: int
    num_blocks: int
    block_size: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    max_model_len: int
    # Speculative decoding totals (``spec_decode.SpecStats``), None without a draft model.
    spec: Any = None

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries \
            if self.prefix_cache_queries else 0.0


@dataclass
class RequestOutput:
    """One step's news for one request.

    ``new_token_ids`` are the tokens generated this step, ``text_delta`` their text (with
    incomplete UTF-8 held back), ``text`` everything generated so far. ``stop_reason`` is the
    stop token id or stop string that ended the request.
    """

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    metrics: RequestMetrics | None = None
    output_token_ids: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None
    # Prompt tokens whose K/V came from the prefix cache (not recomputed).
    num_cached_tokens: int = 0
    # Top-n {token_id: logprob} for each token in ``new_token_ids`` (when requested).
    logprobs: list[dict[int, float]] | None = None
