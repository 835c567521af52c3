"""User-facing decoding knobs, validated once at construction.

Semantics follow the usual conventions (transformers / vLLM): ``temperature == 0`` is greedy
(exact argmax), ``top_k == 0`` disables top-k, ``top_p == 1`` disables nucleus sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The highest temperature a request may ask for (the server's bound too: one range everywhere).
MAX_TEMPERATURE = 100.0
# Larger than any vocabulary (a k past the vocabulary keeps every token, as 0 does); the
# bound keeps k inside the int64 the sampler's tensors hold (a 20-digit k crashed a step).
MAX_TOP_K = 2**31 - 1
# The most stop strings a request may give (the OpenAI API's bound is 4; the server's is this,
# so a request means the same with and without a server).
MAX_STOP_STRINGS = 16


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    Attributes:
        temperature: softmax temperature; 0 means greedy. Range [0, 100].
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; 0 keeps all.
        seed: per-request RNG seed (``None``: non-deterministic). The same seed gives the same
            tokens whatever else is in the batch.
        max_tokens: maximum number of generated tokens (>= 1); ``None`` runs to the context end.
        stop_token_ids: extra token ids that end generation (the tokenizer's EOS ids are added
            by the engine unless ``ignore_eos``).
        ignore_eos: keep generating past EOS / end-of-turn tokens (benchmarks).
        min_p: drop tokens whose probability is below ``min_p`` times the top token's, in
            [0, 1]; 0 disables it.
        repetition_penalty: transformers semantics over prompt and output tokens: a seen
            token's logit is divided by it when positive, multiplied when negative; > 0,
            1 disables it.
        presence_penalty, frequency_penalty: OpenAI semantics over output tokens:
            ``logit -= presence * (count > 0) + frequency * count``; each in [-2, 2].
        stop: strings that end generation; the matched string is not part of the output. At
            most ``MAX_STOP_STRINGS`` (16).
        logprobs: return the top-n log-probabilities per generated token, n in [0, 20];
            ``None`` returns none.

    Raises:
        ValueError: a value is out of range; the message names the field and the range.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = 512
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], "
                             f"got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.top_k <= MAX_TOP_K):
            raise ValueError(f"top_k must be in [0, {MAX_TOP_K}] (0 disables it), "
                             f"got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (0.0 < self.repetition_penalty <= 100.0):
            raise ValueError(
                f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (-2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got "
                             f"{len(self.stop)}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def uses_repetition_penalty(self) -> bool:
        return self.repetition_penalty != 1.0

    @property
    def uses_output_penalty(self) -> bool:
        """Presence or frequency penalty on (both count output tokens only)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        """True when decoding is an exact argmax (temperature 0 or top_k 1)."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing else that reads the logits (no penalty, no logprobs): the
        token is the argmax of the model's own logits (``model.greedy_token_ids``)."""
        return self.greedy and self.logprobs is None and not self.uses_repetition_penalty \
            and not self.uses_output_penalty
