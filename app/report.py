"""The numbers ``ask --json`` and ``ask --stats`` report about one answer.

Read from the final ``RequestOutput`` and its ``RequestMetrics`` with tolerant access: fields
the engine does not provide yet (``num_cached_tokens``, ``prefill_tokens_per_s``,
``decode_tokens_per_s``, speculative counters) are computed from the timestamps when possible,
else reported as None (JSON ``null``).
"""

from __future__ import annotations

from typing import Any


def answer_stats(last: Any, num_prompt_tokens: int, interrupted: bool,
                 speculating: bool = False) -> dict[str, Any]:
    """``finish_reason``, ``usage``, ``timings`` and ``speculative`` for one answer.

    Args:
        last: the last ``RequestOutput`` received (None when none arrived).
        num_prompt_tokens: the prompt length in tokens (used when ``last`` is None).
        interrupted: Ctrl+C ended the answer; ``finish_reason`` is then ``"interrupted"``.
        speculating: the engine runs a drafter (a draft model or ``ngram``), so an answer
            with nothing drafted reports ``num_draft_tokens`` 0 rather than None.

    Returns:
        ``{"finish_reason": str | None, "usage": {"prompt_tokens", "cached_tokens",
        "completion_tokens"}, "timings": {"ttft_s", "prefill_tokens_per_s",
        "decode_tokens_per_s"}, "speculative": None | {"num_draft_tokens",
        "num_accepted_tokens", "acceptance_rate"}}``; token counts are ints (None where a
        remote server sent no usage), times seconds; ``acceptance_rate`` is None when nothing
        was drafted (e.g. prompt lookup found no match).
    """
    metrics = getattr(last, "metrics", None)
    prompt = getattr(last, "num_prompt_tokens", num_prompt_tokens)
    completion = getattr(last, "num_output_tokens", 0)
    cached = getattr(last, "num_cached_tokens", None)
    reason = getattr(last, "finish_reason", None)
    reason = getattr(reason, "value", reason)
    if interrupted:
        reason = "interrupted"
    ttft = _number(getattr(metrics, "ttft", None))
    prefill = _number(getattr(metrics, "prefill_tokens_per_s", None))
    if prefill is None and ttft and prompt is not None:
        prefill = (prompt - (cached or 0)) / ttft
    decode = _number(getattr(metrics, "decode_tokens_per_s", None))
    decode_time = _number(getattr(metrics, "decode_time", None))
    if decode is None and decode_time and completion and completion > 1:
        decode = (completion - 1) / decode_time
    return {
        "finish_reason": reason,
        "usage": {"prompt_tokens": prompt, "cached_tokens": cached,
                  "completion_tokens": completion},
        "timings": {"ttft_s": ttft, "prefill_tokens_per_s": prefill,
                    "decode_tokens_per_s": decode},
        "speculative": _spec_stats(metrics, speculating),
    }


def format_stats_line(stats: dict[str, Any]) -> str:
    """One line for ``--stats``: TTFT, prompt and decode tokens/s, cached tokens, acceptance."""
    usage, timings, spec = stats["usage"], stats["timings"], stats["speculative"]
    cached = "?" if usage["cached_tokens"] is None else usage["cached_tokens"]
    prompt = "?" if usage["prompt_tokens"] is None else usage["prompt_tokens"]
    completion = "?" if usage["completion_tokens"] is None else usage["completion_tokens"]
    parts = [
        f"ttft {_fmt(timings['ttft_s'], '.2f', ' s')}",
        (f"prompt {prompt} tokens ({cached} cached) "
        f"{_fmt(timings['prefill_tokens_per_s'], '.1f', ' tok/s')}"),
        (f"reply {completion} tokens "
        f"{_fmt(timings['decode_tokens_per_s'], '.1f', ' tok/s')}"),
        "acceptance " + ("n/a" if not spec else "n/a (nothing drafted)"
                         if spec["acceptance_rate"] is None
                         else _fmt(spec["acceptance_rate"], '.0%', '')),
        f"finish {stats['finish_reason'] or '?'}",
    ]
    return ", ".join(parts)


def _spec_stats(metrics: Any, speculating: bool) -> dict[str, Any] | None:
    drafted = getattr(metrics, "num_draft_tokens", None)
    accepted = getattr(metrics, "num_accepted_tokens", None)
    if drafted is None or accepted is None or not (drafted or speculating):
        return None
    return {"num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _fmt(value: float | None, spec: str, unit: str) -> str:
    return "?" if value is None else f"{value:{spec}}{unit}"
