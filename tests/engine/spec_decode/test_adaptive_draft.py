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


def test_failed_probes_back_off_and_a_paying_probe_resets_the_wait():
    """Each probe that finds drafting still unprofitable doubles the wait (32, 64, 128, ...,
    at most max_probe_interval); over 1000 tokens that is 5 probes instead of 31, and a probe
    that finds it paying again brings drafting back with the wait reset."""
    ctl = AdaptiveDraftLength(4, probe_interval=32, max_probe_interval=256)
    ctl.observe_times(plain=0.34, draft=0.12, verify=(4, 1.2))
    ctl.observe_times(verify=(1, 0.9))  # verifying even one draft costs 2.6 plain steps
    ctl.observe("r", 4, 2, 3)
    assert ctl.num_spec_tokens("r") == 0  # drafting off at 3 tokens
    waits, n = [], 3
    while n < 1000:
        st = ctl._requests["r"]
        k = ctl.num_spec_tokens("r")  # decided with n tokens generated
        n += 1
        if k:
            waits.append(st.generated - st.off_since)
            ctl.observe("r", k, 1, n)  # accepted, yet drafting still does not pay
        else:
            ctl.note_generated("r", n)
    assert waits == [32, 64, 128, 256, 256], waits
    assert ctl.probe_wait("r") == 256
    for _ in range(30):  # verification became cheap (the EMAs follow): the next probe pays
        ctl.observe_times(verify=(1, 0.36))
        ctl.observe_times(verify=(4, 0.45))
    while not ctl.num_spec_tokens("r"):
        n += 1
        ctl.note_generated("r", n)
    ctl.observe("r", 1, 1, n + 1)
    assert ctl._requests["r"].failed_probes == 0 and ctl._requests["r"].off_since is None
    assert ctl.num_spec_tokens("r") >= 1
    assert ctl.probe_wait("r") == 32


def test_new_requests_inherit_the_engines_backoff_until_a_probe_pays():
    """Where drafting stopped paying, a new request waits as long as the engine has learned
    to (capped at inherit_levels doublings) before its first probe, instead of probing after
    probe_interval tokens again; a probe that pays resets the level for later requests."""
    ctl = AdaptiveDraftLength(4, probe_interval=32, max_probe_interval=512, inherit_levels=3)
    ctl.observe_times(plain=0.34, draft=0.12, verify=(4, 1.2))
    ctl.observe_times(verify=(1, 0.9))
    ctl.observe("a", 4, 2, 3)
    n = 3
    for _ in range(5):  # five failed probes on request a
        while not ctl.num_spec_tokens("a"):
            n += 1
            ctl.note_generated("a", n)
        n += 1
        ctl.observe("a", 1, 1, n)
    assert ctl._requests["a"].failed_probes == 5
    assert ctl.probe_wait("b") == 32 * 2**3  # inherited, capped at 3 doublings
    assert ctl.num_spec_tokens("b") == 0
    for _ in range(30):  # verification became cheap
        ctl.observe_times(verify=(1, 0.36))
        ctl.observe_times(verify=(4, 0.45))
    while not ctl.num_spec_tokens("a"):
        n += 1
        ctl.note_generated("a", n)
    ctl.observe("a", 1, 1, n + 1)  # a's probe pays: the engine's level resets
    assert ctl.probe_wait("c") == 32
