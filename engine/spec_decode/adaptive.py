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
drafting never paid. The step times are EMAs measured by the
engine: on a CPU, verifying k + 1 tokens costs visibly more than decoding one, and that,
not the acceptance rate, often decides whether drafting pays. Until a plain decode step has been
timed (the yardstick every other cost is compared with) no request drafts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _RequestState:
    accepted: float  # EMA numerators/denominators of the acceptance estimate
    observed: float
    generated: int = 0
    off_since: int | None = None  # tokens generated when drafting switched off
    failed_probes: int = 0  # probes since then that found drafting still unprofitable

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
        decay: EMA decay per observation.
    """

    def __init__(self, max_k: int, draft_cost_ratio: float = 0.3, *, adaptive: bool = True,
                 probe_interval: int = 32, max_probe_interval: int = 512,
                 inherit_levels: int = 3, prior_acceptance: float = 0.7,
                 decay: float = 0.8) -> None:
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
        self.t_plain: float | None = None
        self.t_draft: float | None = None  # one draft forward (one token per request)
        self.t_verify: dict[int, float] = {}  # k -> one target forward verifying k drafts
        self._requests: dict[str, _RequestState] = {}

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
        plain step has been timed, the priors are relative to a plain step of 1."""
        t_plain = self.t_plain if self.t_plain is not None else 1.0
        a = min(max(acceptance, 0.0), 0.999)
        expected = (1 - a ** (k + 1)) / (1 - a)
        t_draft = self.t_draft if self.t_draft is not None else self.draft_cost_ratio * t_plain
        return expected * t_plain / (k * t_draft + self._verify_cost(k, t_plain))

    def _verify_cost(self, k: int, t_plain: float) -> float:
        if k in self.t_verify:
            return self.t_verify[k]
        if self.t_verify:  # linear in k through the nearest measured point
            near = min(self.t_verify, key=lambda m: abs(m - k))
            per_token = max(self.t_verify[near] - t_plain, 0.0) / near
            return t_plain + per_token * k
        return t_plain * (1 + 0.05 * k)

    def num_spec_tokens(self, rid: str) -> int:
        """k for request ``rid`` this step (0: decode without drafting)."""
        if not self.adaptive:
            return self.max_k
        if self.t_plain is None:
            # The cost of a plain decode step is the yardstick: measure it first.
            return 0
        st = self._state(rid)
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
                      verify: tuple[int, float] | None = None) -> None:
        """Fold measured seconds into the cost EMAs: a plain decode step, one draft forward,
        or ``(k, seconds)`` of a verification step."""
        d = self.decay
        if plain is not None:
            self.t_plain = plain if self.t_plain is None else d * self.t_plain + (1 - d) * plain
        if draft is not None:
            self.t_draft = draft if self.t_draft is None else d * self.t_draft + (1 - d) * draft
        if verify is not None:
            k, t = verify
            old = self.t_verify.get(k)
            self.t_verify[k] = t if old is None else d * old + (1 - d) * t

    def forget(self, rid: str) -> None:
        self._requests.pop(rid, None)
