"""User-facing decoding knobs, validated once at construction.

Semantics follow the usual conventions (transformers / vLLM): ``temperature == 0`` is greedy
(exact argmax), ``top_k == 0`` disables top-k, ``top_p == 1`` disables nucleus sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        """True when decoding is an exact argmax (temperature 0 or top_k 1)."""
        return self.temperature == 0.0 or self.top_k == 1
