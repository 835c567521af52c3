"""Lifecycle state of one generation request (vLLM's ``Request``, simplified)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request stopped: ``stop`` (a stop token), ``length`` (``max_tokens`` or the
    context end) or ``abort`` (cancelled by the caller)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass
class Request:
    """One prompt being generated.

    ``prompt_token_ids`` and ``output_token_ids`` are lists of token ids; ``num_computed_tokens``
    counts tokens whose K/V is already in the paged cache. ``block_ids`` are the KV blocks
    owned by this request, in sequence order.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    stop_token_ids: frozenset[int] = frozenset()
    max_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # The stop token id or stop string that ended the request (finish_reason STOP).
    stop_reason: int | str | None = None
    # Per generated token, {token_id: logprob} of the top-n tokens (SamplingParams.logprobs).
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    # Chained hashes of the full blocks of prompt + output (``KVCacheManager.block_hashes``).
    block_hashes: list[int] = field(default_factory=list)
    # Prompt tokens found in the prefix cache when the request was first scheduled.
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # Speculative decoding: draft tokens verified and accepted so far.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Tokens appended by the latest step (more than one when drafts were accepted).
    num_new_tokens: int = 0
    # Timings, ``time.perf_counter`` seconds; ``prefill_done_time`` is when the whole prompt
    # was computed (its last chunk ran), which is also the first token's time.
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions ``[start, end)`` of prompt + output, without building the
        whole concatenation (the model runner calls this every step)."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        head = self.prompt_token_ids[start:p] if start < p else []
        return head + self.output_token_ids[max(start - p, 0) : end - p]

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
