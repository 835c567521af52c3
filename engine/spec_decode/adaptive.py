"""How many tokens to draft per request: a cost model fed by measured step times.

With per-token acceptance rate ``a`` (a request's EMA), drafting k tokens yields on average
``E(k) = (1 - a^(k+1)) / (1 - a)`` tokens per target step (Leviathan et al. 2023, eq. 1), and
costs ``k * t_draft + t_verify(k)`` against ``t_plain`` for a plain decode step. The expected
speedup is ``E(k) * t_plain / (k * t_draft + t_verify(k))``; each request drafts the k in
``[1, max_k]`` that maximises it, or nothing when the best is below 1. A request that stopped
drafting probes again (with k = 1) after ``probe_interval`` generated tokens, so a prompt where
the draft starts agreeing gets speculation back; each probe that finds drafting still
unprofitable doubles the wait (up to ``max_probe_interval``), as a retransmission timer backs
off, because a probe is not free: the draft first catches up on every token since it last
ran (a new request's whole prompt), then a verification step costs more than a plain one. A
new request starts at the engine's current backoff level (at most ``inherit_levels``, so its
first probe comes after ``probe_interval * 2**inherit_levels`` tokens at the latest), which a
probe that pays resets for everyone: where drafting has stopped paying, new requests do not
rediscover it one probe at a time. With fixed 32-token probes the
Qwen2.5-Coder 1.5B / 0.5B pair ran at 0.87-0.92x plain decoding on a 2-core CPU where
drafting never paid. The step times are measured by the
engine (below): on a CPU, verifying k + 1 tokens costs visibly more than decoding one, and that,
not the acceptance rate, often decides whether drafting pays. Until a plain decode step has been
timed (the yardstick every other cost is compared with) no request drafts. While every request
drafts, no plain step is timed, and a yardstick from the start of the run goes stale as a
shared machine's speed drifts: the Qwen2.5-Coder 1.5B / 0.5B pair (2-core AMD EPYC, AVX2)
kept drafting on a chat prompt at 0.91x plain decoding because ``t_plain`` still held 57 ms,
timed once after the prompt, against the 36-43 ms its plain steps took. So after
``refresh_interval`` verification steps one step decodes plainly for every request. And each
cost is the (lower) median of its last ``cost_window`` samples rather than an average of all
of them: every cost then follows the machine's present speed at the same pace, and one
outlier (a step that faulted pages in, another process's burst) moves none. (The least of
the samples, tried first, read the draft forward after a rejection, one token, where most
draft steps compute two: it made drafting look cheaper than it ran.)

A probe is dearer than its verification: the draft first computes every token since it last
ran, so probing after N tokens costs about N draft prefill tokens whatever N is (the
Qwen2.5-Coder-0.5B draft's 19-token catch-up took 144 ms, four plain 1.5B steps, on the 2-core
AVX2 machine, 7.6 ms a token against a 33-38 ms plain step: a request that probes
forever pays about a fifth of its time for it, however long the waits between probes, since
the catch-up grows with the wait). So the engine times catch-ups per token (``t_catch_up``),
and once the draft and verification costs are measured no request probes, and no new request
starts drafting (its first draft computes its prompt), while drafting at the acceptance a
request is assumed to reach (``prior_acceptance``) would not win back what the catch-up
costs (:meth:`hopeless`). There a draft forward cost 15-22 ms against the 1.5B's 32-39 ms
plain step: chat prompts (50-80% acceptance) that started drafting or probed ran at 0.70-0.80x,
while prompts that never drafted ran at 0.88-1.17x of the same plain decoding (this machine's
noise). A request that drafts already goes on while its own estimate pays.

The costs compared are a step's whole: ``t_overhead``, the time a decode step spends outside
the draft and target forwards (scheduling, sampling, building outputs; 4-6 ms of the 1.5B's
36-40 ms step there), is paid once per step, so a step that yields several tokens saves it
several times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


def _median(samples: deque[float]) -> float:
    ordered = sorted(samples)
    return ordered[(len(ordered) - 1) // 2]  # the lower middle: an actual sample


@dataclass
class _RequestState:
    accepted: float  # EMA numerators/denominators of the acceptance estimate
    observed: float
    generated: int = 0
    off_since: int | None = None  # tokens generated when drafting switched off
    failed_probes: int = 0  # probes since then that found drafting still unprofitable
    drafted: bool = False  # whether a draft of this request has been verified

    @property
    def acceptance(self) -> float:
        return self.accepted / self.observed if self.observed else 0.0


class AdaptiveDraftLength:
    """Chooses ``k`` per request from its acceptance EMA and the measured step costs.

    Args:
        max_k: the most draft tokens per step (``num_speculative_tokens``).
        draft_cost_ratio: prior for ``t_draft / t_plain`` before it is measured (e.g. the
            parameter ratio of draft to target).
        adaptive: ``False`` always drafts ``max_k``.
        probe_interval: tokens before the first probe of a request whose drafting is off;
            doubled after each failed probe.
        max_probe_interval: the longest wait between probes (tokens).
        inherit_levels: the most failed-probe doublings a new request inherits from the
            engine's recent requests.
        prior_acceptance: acceptance assumed before a request has been observed.
        decay: EMA decay per observation of the acceptance estimate.
        refresh_interval: verification steps in a row after which the next step decodes
            plainly for every request, to time ``t_plain`` again.
        cost_window: samples per cost (seconds) whose median is the cost.
    """

    def __init__(self, max_k: int, draft_cost_ratio: float = 0.3, *, adaptive: bool = True,
                 probe_interval: int = 32, max_probe_interval: int = 512,
                 inherit_levels: int = 3, prior_acceptance: float = 0.7,
                 decay: float = 0.8, refresh_interval: int = 16,
                 cost_window: int = 8) -> None:
        if max_k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {max_k}")
        self.max_k = max_k
        self.adaptive = adaptive
        self.probe_interval = probe_interval
        self.max_probe_interval = max(max_probe_interval, probe_interval)
        self.inherit_levels = inherit_levels
        self._backoff_level = 0  # failed probes in a row, engine-wide
        self.prior_acceptance = prior_acceptance
        self.decay = decay
        self.draft_cost_ratio = draft_cost_ratio
        self.refresh_interval = refresh_interval
        self.cost_window = cost_window
        self._verify_steps = 0  # verification steps since a plain step was timed
        # recent samples (seconds) per cost: "plain", "draft" (one draft forward, one token
        # per request), "catch_up" (the draft's catch-up, per token computed), k (one target
        # forward verifying k drafts)
        self._samples: dict[str | int, deque[float]] = {}
        self._costs: dict[str | int, float] = {}  # each key's median, updated per sample
        self._verify: dict[int, float] = {}  # the int keys' medians (read several times a step)
        self._requests: dict[str, _RequestState] = {}

    def _cost(self, key: str | int) -> float | None:
        return self._costs.get(key)

    @property
    def t_plain(self) -> float | None:
        """A plain decode step (s), or None before one is timed."""
        return self._cost("plain")

    @property
    def t_draft(self) -> float | None:
        """One draft forward, one token per request (s)."""
        return self._cost("draft")

    @property
    def t_catch_up(self) -> float | None:
        """The draft's catch-up per token computed (s)."""
        return self._cost("catch_up")

    @property
    def t_overhead(self) -> float | None:
        """A decode step's time outside the draft and target forwards (s)."""
        return self._cost("overhead")

    @property
    def t_verify(self) -> dict[int, float]:
        """k -> one target forward verifying k drafts (s), for each k timed (read only)."""
        return self._verify

    def _state(self, rid: str) -> _RequestState:
        st = self._requests.get(rid)
        if st is None:
            # The prior counts as two observations, so real ones take over quickly.
            st = _RequestState(2 * self.prior_acceptance, 2.0,
                               failed_probes=min(self._backoff_level, self.inherit_levels))
            self._requests[rid] = st
        return st

    def speedup(self, acceptance: float, k: int) -> float:
        """Expected tokens/s with k drafts relative to plain decoding (> 1 pays). Before a
        plain step has been timed, the priors are relative to a plain step of 1. Every step
        also pays ``t_overhead`` (scheduling, sampling, outputs: the step's time outside the
        draft and target forwards), once per step however many tokens it yields."""
        t_plain = self.t_plain if self.t_plain is not None else 1.0
        a = min(max(acceptance, 0.0), 0.999)
        expected = (1 - a ** (k + 1)) / (1 - a)
        t_draft = self.t_draft if self.t_draft is not None else self.draft_cost_ratio * t_plain
        over = self.t_overhead or 0.0
        return expected * (t_plain + over) / (k * t_draft + self._verify_cost(k, t_plain) + over)

    def _verify_cost(self, k: int, t_plain: float) -> float:
        t_verify = self.t_verify
        if k in t_verify:
            return t_verify[k]
        if t_verify:  # linear in k through the nearest measured point
            near = min(t_verify, key=lambda m: abs(m - k))
            per_token = max(t_verify[near] - t_plain, 0.0) / near
            return t_plain + per_token * k
        return t_plain * (1 + 0.05 * k)

    def num_spec_tokens(self, rid: str) -> int:
        """k for request ``rid`` this step (0: decode without drafting)."""
        if not self.adaptive:
            return self.max_k
        if self.t_plain is None or self.refreshing:
            # The cost of a plain decode step is the yardstick: measure it first, and again
            # every refresh_interval verification steps.
            return 0
        st = self._state(rid)
        if st.off_since is not None or not st.drafted:
            # Starting (the draft first computes the prompt) and probing (the tokens since it
            # last ran) both begin with a catch-up: not while that cannot pay.
            if self.hopeless():
                return 0
        if st.off_since is not None:
            if st.generated - st.off_since < self.probe_wait(rid):
                return 0
            return 1  # probe; ``observe`` decides whether drafting comes back
        best_k, best = 1, 0.0
        for k in range(1, self.max_k + 1):
            s = self.speedup(st.acceptance, k)
            if s > best:
                best_k, best = k, s
        if best < 1.0:
            st.off_since = st.generated
            return 0
        return best_k

    def hopeless(self) -> bool:
        """Whether the measured costs (a draft forward and a verification timed, not
        priors) say a catch-up cannot pay: drafting at ``prior_acceptance`` (what a request is
        assumed to reach) would gain less than the catch-up costs, ``t_catch_up`` per plain
        step (with its overhead) of the tokens caught up on (once a catch-up has been timed;
        else the gain must just be positive)."""
        if self.t_draft is None or not self.t_verify or self.t_plain is None:
            return False
        best = max(self.speedup(self.prior_acceptance, k) for k in range(1, self.max_k + 1))
        step = self.t_plain + (self.t_overhead or 0.0)
        return best < 1.0 + (self.t_catch_up or 0.0) / step

    @property
    def refreshing(self) -> bool:
        """Whether this step decodes plainly for every request to time ``t_plain`` again
        (``refresh_interval`` verification steps since one was timed)."""
        return self._verify_steps >= self.refresh_interval

    def probe_wait(self, rid: str) -> int:
        """Generated tokens request ``rid`` waits with drafting off before its next probe:
        ``probe_interval`` doubled per failed probe, at most ``max_probe_interval``."""
        fails = self._state(rid).failed_probes
        return min(self.probe_interval << min(fails, 30), self.max_probe_interval)

    def observe(self, rid: str, k: int, num_accepted: int, num_generated: int) -> None:
        """Record a verification: ``num_accepted`` of ``k`` drafts accepted; the request has
        ``num_generated`` output tokens now."""
        st = self._state(rid)
        st.generated = num_generated
        if k <= 0:
            return
        st.drafted = True
        rejected = 1 if num_accepted < k else 0
        st.accepted = self.decay * st.accepted + num_accepted
        st.observed = self.decay * st.observed + num_accepted + rejected
        if st.off_since is not None:
            best = max(self.speedup(st.acceptance, j) for j in range(1, self.max_k + 1))
            if best >= 1.0:
                st.off_since, st.failed_probes = None, 0
                self._backoff_level = 0
            else:
                st.off_since, st.failed_probes = num_generated, st.failed_probes + 1
                self._backoff_level = max(self._backoff_level, st.failed_probes)

    def note_generated(self, rid: str, num_generated: int) -> None:
        """A step without drafting for ``rid``: count its tokens toward the next probe."""
        self._state(rid).generated = num_generated

    def observe_times(self, *, plain: float | None = None, draft: float | None = None,
                      verify: tuple[int, float] | None = None,
                      catch_up: tuple[int, float] | None = None,
                      overhead: float | None = None) -> None:
        """Record measured seconds of a cost: a plain decode step, one draft forward,
        ``(k, seconds)`` of a verification step, ``(tokens, seconds)`` of a draft catch-up
        (a propose call that first computed ``tokens`` > k + 1 tokens), or a decode step's
        ``overhead`` outside the forwards."""
        if catch_up is not None and catch_up[0] > 0:
            self._add("catch_up", catch_up[1] / catch_up[0])
        if overhead is not None:
            self._add("overhead", overhead)
        if plain is not None:
            self._add("plain", plain)
            self._verify_steps = 0
        if draft is not None:
            self._add("draft", draft)
        if verify is not None:
            self._verify_steps += 1
            self._add(verify[0], verify[1])

    def _add(self, key: str | int, seconds: float) -> None:
        samples = self._samples.get(key)
        if samples is None:
            # The first of each kind runs cold (a memory-mapped model faults its weights in,
            # buffers are allocated: the 0.5B draft's first forward took 30 ms against 15-20
            # later) and, once drafting has stopped, might never be displaced: not kept.
            self._samples[key] = deque(maxlen=self.cost_window)
            return
        samples.append(seconds)
        self._costs[key] = _median(samples)
        if isinstance(key, int):
            self._verify[key] = self._costs[key]

    def forget(self, rid: str) -> None:
        self._requests.pop(rid, None)
