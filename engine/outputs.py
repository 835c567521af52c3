"""What leaves the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import FinishReason


@dataclass
class RequestMetrics:
    """Per-request timings in seconds (``time.perf_counter`` clock).

    ``ttft`` is arrival to first generated token; ``decode_time`` first token to the latest.
    """

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None

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
    # Top-n {token_id: logprob} for each token in ``new_token_ids`` (when requested).
    logprobs: list[dict[int, float]] | None = None
