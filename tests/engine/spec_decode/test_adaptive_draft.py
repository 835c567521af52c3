"""The adaptive draft length follows the cost model of Leviathan et al. 2023 (eq. 1):
``E(k) * t_plain / (k * t_draft + t_verify(k))``, evaluated here by hand for each case."""

from __future__ import annotations

import pytest

from localchat.engine.spec_decode.adaptive import AdaptiveDraftLength


def expected_speedup(a: float, k: int, t_plain: float, t_draft: float, t_verify: float) -> float:
    return (1 - a ** (k + 1)) / (1 - a) * t_plain / (k * t_draft + t_verify)


def test_no_drafting_until_a_plain_step_is_timed():
    ctl = AdaptiveDraftLength(4)
    assert ctl.num_spec_tokens("r") == 0
    ctl.observe_times(plain=0.34)
    assert ctl.num_spec_tokens("r") > 0


def test_expensive_verification_switches_drafting_off_then_probes():
    # This CPU: verifying 4 drafts costs ~3.5 plain steps (small-M GEMMs are compute bound).
    ctl = AdaptiveDraftLength(4, probe_interval=8)
    ctl.observe_times(plain=0.34, draft=0.12, verify=(4, 1.2))
    for n in range(1, 6):  # 92% acceptance, as the Qwen pair measured
        ctl.observe("r", 4, 4 if n % 3 else 3, 5 * n)
    a = ctl._requests["r"].acceptance
    best = max(expected_speedup(a, k, 0.34, 0.12, 0.34 + (1.2 - 0.34) * k / 4)
               for k in range(1, 5))
    assert best < 1
    assert ctl.num_spec_tokens("r") == 0
    ctl.note_generated("r", 5 * 5 + 7)
    assert ctl.num_spec_tokens("r") == 0  # fewer than probe_interval tokens since
    ctl.note_generated("r", 5 * 5 + 8)
    assert ctl.num_spec_tokens("r") == 1  # a probe


@pytest.mark.parametrize("verify", [0.40, 0.60])
def test_cheap_verification_picks_the_k_with_the_best_expected_speedup(verify):
    ctl = AdaptiveDraftLength(6)
    ctl.observe_times(plain=0.30, draft=0.03, verify=(4, verify))
    for n in range(1, 8):
        ctl.observe("r", 4, 3, 4 * n)
    a = ctl._requests["r"].acceptance
    per_token = (verify - 0.30) / 4
    want = max(range(1, 7), key=lambda k: expected_speedup(a, k, 0.30, 0.03,
                                                             0.30 + per_token * k))
    assert ctl.num_spec_tokens("r") == want
