"""Server metrics in the Prometheus text exposition format (version 0.0.4).

Counters (requests by route and status, prompt / cached / generated tokens), histograms
(time to first token, time per output token after the first, whole-request latency, in
seconds) and gauges read from the engine's ``EngineStats`` at scrape time (running and waiting
requests, KV cache usage, prefix-cache hit rate, preemptions, speculative acceptance).
Written by hand: the format is a few lines of text (no ``prometheus_client`` dependency).
Reference: prometheus.io "Exposition formats"; vLLM's ``vllm:`` metric set (names differ).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

PREFIX = "localchat"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    """Cumulative-bucket histogram of non-negative observations (seconds)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}",
                f"{name}_count {self.count}"]
        return out


class ServerMetrics:
    """What the routes record; ``render(stats)`` writes the exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.aborted = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)

    def record_status(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1

    def record_finished(self, last: Any, aborted: bool) -> None:
        """Count one finished (or aborted) generation from its last ``RequestOutput``."""
        with self._lock:
            if aborted:
                self.aborted += 1
            if last is None:
                return
            self.prompt_tokens += last.num_prompt_tokens
            self.cached_tokens += last.num_cached_tokens
            self.generation_tokens += last.num_output_tokens
            m = last.metrics
            if m is None:
                return
            if m.ttft is not None:
                self.ttft.observe(max(0.0, m.ttft))
            if m.decode_time is not None and m.num_output_tokens > 1:
                self.tpot.observe(max(0.0, m.decode_time) / (m.num_output_tokens - 1))
            if m.last_token_time is not None:
                self.latency.observe(max(0.0, m.last_token_time - m.arrival_time))

    def render(self, stats: Any, in_flight: int) -> str:
        """The ``/metrics`` text for the current ``EngineStats`` snapshot."""
        p = PREFIX
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            lines.append(f"# HELP {p}_{name} {help_text}")
            lines.append(f"# TYPE {p}_{name} {kind}")
            lines.extend(f"{p}_{s}" for s in samples)

        with self._lock:
            metric("requests_total", "counter", "HTTP requests by route and status.",
                   [f'requests_total{{route="{r}",status="{s}"}} {n}'
                    for (r, s), n in sorted(self.requests.items())])
            metric("requests_aborted_total", "counter",
                   "Generations aborted (client disconnected).",
                   [f"requests_aborted_total {self.aborted}"])
            metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                   [f"prompt_tokens_total {self.prompt_tokens}"])
            metric("cached_prompt_tokens_total", "counter",
                   "Prompt tokens served from the prefix cache.",
                   [f"cached_prompt_tokens_total {self.cached_tokens}"])
            metric("generation_tokens_total", "counter", "Generated tokens.",
                   [f"generation_tokens_total {self.generation_tokens}"])
            metric("time_to_first_token_seconds", "histogram",
                   "Arrival to first generated token.",
                   self.ttft.lines("time_to_first_token_seconds"))
            metric("time_per_output_token_seconds", "histogram",
                   "Decode time per token after the first.",
                   self.tpot.lines("time_per_output_token_seconds"))
            metric("request_latency_seconds", "histogram", "Arrival to last token.",
                   self.latency.lines("request_latency_seconds"))
        metric("requests_in_flight", "gauge", "Requests admitted and not finished.",
               [f"requests_in_flight {in_flight}"])
        metric("num_requests_running", "gauge", "Requests in the running batch.",
               [f"num_requests_running {stats.num_running}"])
        metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
               [f"num_requests_waiting {stats.num_waiting}"])
        metric("kv_cache_usage_ratio", "gauge", "Fraction of KV blocks held by requests.",
               [f"kv_cache_usage_ratio {stats.kv_cache_usage:.6f}"])
        metric("kv_cache_blocks", "gauge", "KV blocks in the pool.",
               [f"kv_cache_blocks {stats.num_blocks}"])
        metric("prefix_cache_hit_rate", "gauge", "Cached / looked-up prompt tokens since start.",
               [f"prefix_cache_hit_rate {stats.prefix_cache_hit_rate:.6f}"])
        metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up.",
               [f"prefix_cache_queries_total {stats.prefix_cache_queries}"])
        metric("prefix_cache_hits_total", "counter", "Prompt tokens found cached.",
               [f"prefix_cache_hits_total {stats.prefix_cache_hits}"])
        metric("num_preemptions_total", "counter", "Requests preempted for KV blocks.",
               [f"num_preemptions_total {stats.num_preemptions}"])
        spec = stats.spec
        if spec is not None:
            metric("spec_decode_draft_tokens_total", "counter", "Draft tokens verified.",
                   [f"spec_decode_draft_tokens_total {spec.num_draft_tokens}"])
            metric("spec_decode_accepted_tokens_total", "counter", "Draft tokens accepted.",
                   [f"spec_decode_accepted_tokens_total {spec.num_accepted_tokens}"])
            metric("spec_decode_acceptance_rate", "gauge", "Accepted / drafted tokens.",
                   [f"spec_decode_acceptance_rate {spec.acceptance_rate:.6f}"])
        return "\n".join(lines) + "\n"


KNOWN_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
MODEL_ROUTE = "/v1/models/{model}"


def route_label(path: str) -> str:
    """The ``route`` label of ``path``: a known route, ``/v1/models/{model}`` for any model
    id, else ``other`` (so a scanner cannot grow the label set)."""
    if path in KNOWN_ROUTES:
        return path
    if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        return MODEL_ROUTE
    return "other"


class StatusCounter:
    """Pure ASGI middleware counting responses by route and status (``route_label``). An
    exception that escapes the app before a response started is counted as the 500 that
    Starlette's outermost error middleware answers with."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_label(scope.get("path", ""))
        started = False

        async def counted(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.record_status(route, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:  # ServerErrorMiddleware (outside us) answers it with a 500
                self.metrics.record_status(route, 500)
            raise
