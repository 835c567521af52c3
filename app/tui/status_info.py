"""The numbers the status bar shows, read tolerantly from the engine and its outputs.

``StatusInfo`` is filled from the engine's ``EngineInfo`` (model, weight format, device,
``max_model_len``; a remote engine's as its server reports it), from the latest ``RequestOutput`` of the current
turn (TTFT, decode tokens/s, cached prompt tokens, speculative acceptance, context used) and
from ``EngineStats`` (KV cache usage). Fields an engine does not provide (speculative
counters, a quantized format) stay None and show as ``-``. ``format_status`` renders one line that fits ``width`` cells.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rich.text import Text

from localchat.engine.outputs import EngineInfo

BAR_CELLS = 6


@dataclass(frozen=True)
class StatusInfo:
    """Status bar values; times in seconds, rates in tokens/s, ``kv_usage`` in [0, 1]."""

    state: str = "loading"  # loading | ready | streaming | error
    model: str = "-"
    weight_format: str | None = None
    device: str | None = None
    ttft: float | None = None
    decode_tokens_per_s: float | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    spec_acceptance: float | None = None
    kv_usage: float | None = None
    context_used: int | None = None
    max_model_len: int | None = None


def engine_fields(info: EngineInfo, model: str) -> dict[str, Any]:
    """``StatusInfo`` fields from an engine's ``EngineInfo``: ``model`` (the name the user
    chose), weight format, device and ``max_model_len``. A remote engine's info leaves what
    its server does not report None (shown as ``-``)."""
    return {"model": model, "weight_format": info.weight_format,
            "device": None if info.device is None else str(info.device),
            "max_model_len": info.max_model_len or None}


def with_output(info: StatusInfo, out: Any) -> StatusInfo:
    """``info`` updated from one ``RequestOutput`` of the current turn."""
    metrics = getattr(out, "metrics", None)
    prompt = getattr(out, "num_prompt_tokens", None)
    produced = getattr(out, "num_output_tokens", 0) or 0
    drafted = getattr(metrics, "num_draft_tokens", None) or getattr(out, "num_draft_tokens", None)
    accepted = getattr(metrics, "num_accepted_tokens", None)
    if accepted is None:
        accepted = getattr(out, "num_accepted_tokens", None)
    spec = accepted / drafted if drafted and accepted is not None else None
    return replace(
        info, ttft=_num(getattr(metrics, "ttft", None)),
        decode_tokens_per_s=_num(getattr(metrics, "decode_tokens_per_s", None)),
        cached_tokens=getattr(out, "num_cached_tokens", None), prompt_tokens=prompt,
        spec_acceptance=spec,
        context_used=None if prompt is None else prompt + produced)


def for_conversation(info: StatusInfo, messages: Any) -> StatusInfo:
    """``info`` with the per-turn figures (TTFT, tokens/s, cached, acceptance, context used)
    of the conversation now shown: those of its last reply's stored stats, else none (a new
    conversation shows ``-``, not the previous conversation's figures)."""
    cleared = replace(info, ttft=None, decode_tokens_per_s=None, cached_tokens=None,
                      prompt_tokens=None, spec_acceptance=None, context_used=None)
    stats = next((m.stats for m in reversed(list(messages))
                  if m.role == "assistant" and isinstance(m.stats, dict)), None)
    if not stats:
        return cleared
    usage, timings = stats.get("usage") or {}, stats.get("timings") or {}
    spec = stats.get("speculative") or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens") or 0
    return replace(cleared, ttft=_num(timings.get("ttft_s")),
                   decode_tokens_per_s=_num(timings.get("decode_tokens_per_s")),
                   cached_tokens=usage.get("cached_tokens"), prompt_tokens=prompt,
                   spec_acceptance=_num(spec.get("acceptance_rate")),
                   context_used=None if prompt is None else prompt + completion)


def with_stats(info: StatusInfo, stats: Any) -> StatusInfo:
    """``info`` updated from an ``EngineStats`` snapshot (KV usage, ``max_model_len``)."""
    usage = _num(getattr(stats, "kv_cache_usage", None))
    max_len = getattr(stats, "max_model_len", None) or info.max_model_len
    return replace(info, kv_usage=usage, max_model_len=max_len)


def sampling_summary(sampling: dict[str, Any]) -> str:
    """The sampling in effect, short: ``temp 0.2 · top-p 0.9 · max 512`` (fields at their
    neutral value, such as ``top_k`` 0 or ``min_p`` 0, are left out)."""
    parts = []
    for name, label, neutral in (("temperature", "temp", None), ("top_p", "top-p", 1.0),
                                 ("top_k", "top-k", 0), ("min_p", "min-p", 0.0),
                                 ("repetition_penalty", "rep", 1.0), ("max_tokens", "max", None),
                                 ("seed", "seed", None)):
        value = sampling.get(name)
        if value is None or (neutral is not None and value == neutral):
            continue
        parts.append(f"{label} {value:g}" if isinstance(value, float) else f"{label} {value}")
    return " · ".join(parts)


def kv_bar(usage: float | None, cells: int = BAR_CELLS) -> str:
    """A small bar of ``cells`` characters, filled in proportion to ``usage`` (0..1)."""
    if usage is None:
        return "-"
    filled = min(cells, max(0, round(usage * cells)))
    return "█" * filled + "░" * (cells - filled)


def format_status(info: StatusInfo, width: int = 200) -> Text:
    """One status line of at most ``width`` cells: parts lose their labels first, least
    important first, then the least important parts are left out."""
    model = info.model + (f" {info.weight_format}" if info.weight_format else "")
    state = {"loading": "loading…", "error": "no model", "streaming": "●"}.get(info.state, "")
    cached = "-" if info.cached_tokens is None else (
        f"{info.cached_tokens}/{info.prompt_tokens}" if info.prompt_tokens else
        str(info.cached_tokens))
    used = "-" if info.context_used is None else str(info.context_used)
    ctx = f"{used}/{info.max_model_len}" if info.max_model_len else used
    usage = "" if info.kv_usage is None else f" {info.kv_usage:.0%}"
    parts = [  # (labelled form, short form, importance: higher is dropped/shortened first)
        (f"{model} {state}".strip(), f"{info.model} {state}".strip(), 0),
        (info.device or "", "", 6),
        (f"TTFT {_fmt(info.ttft, '.2f', 's')}", _fmt(info.ttft, '.2f', 's'), 3),
        (f"{_fmt(info.decode_tokens_per_s, '.1f', '')} tok/s",
         f"{_fmt(info.decode_tokens_per_s, '.0f', '')}t/s", 2),
        (f"cached {cached}", f"c {cached}", 1),
        (f"spec {_fmt(info.spec_acceptance, '.0%', '')}",
         f"s {_fmt(info.spec_acceptance, '.0%', '')}", 5),
        (f"KV {kv_bar(info.kv_usage)}{usage}", kv_bar(info.kv_usage, 4), 4),
        (f"ctx {ctx}", ctx, 3),
    ]
    order = sorted(range(len(parts)), key=lambda i: -parts[i][2])
    attempts = [(set(order[:n]), set()) for n in range(len(parts) + 1)]
    attempts += [(set(order), set(order[:n])) for n in range(1, len(parts))]
    line = ""
    for short, dropped in attempts:
        chosen = [parts[i][1] if i in short else parts[i][0]
                  for i in range(len(parts)) if i not in dropped]
        line = " │ ".join(c for c in chosen if c)
        if len(line) <= width:
            break
    return Text(line[:width])


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _fmt(value: float | None, spec: str, unit: str) -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"
