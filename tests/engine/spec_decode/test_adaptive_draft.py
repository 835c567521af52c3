"""The adaptive draft length follows the cost model of Leviathan et al. 2023 (eq. 1):
``E(k) * t_plain / (k * t_draft + t_verify(k))``, evaluated here by hand for each case."""

from __future__ import annotations

import pytest

from localchat.engine.spec_decode.adaptive import AdaptiveDraftLength


def expected_speedup(a: float, k: int, t_plain: float, t_draft: float, t_verify: float) -> float:
    return (1 - a ** (k + 1)) / (1 - a) * t_plain / (k * t_draft + t_verify)


def primed(*args, **kwargs) -> AdaptiveDraftLength:
    """A controller past its cold samples (the first of each cost is not kept)."""
    ctl = AdaptiveDraftLength(*args, **kwargs)
    for k in range(1, ctl.max_k + 1):
        ctl.observe_times(verify=(k, 9.0))
    ctl.observe_times(draft=9.0, catch_up=(1, 9.0), plain=9.0)
    assert ctl.t_plain is None and ctl.t_draft is None and not ctl.t_verify
    return ctl


def test_no_drafting_until_a_plain_step_is_timed():
    """...and the first plain step, which runs cold, does not count."""
    ctl = AdaptiveDraftLength(4)
    assert ctl.num_spec_tokens("r") == 0
    ctl.observe_times(plain=0.50)
    assert ctl.t_plain is None and ctl.num_spec_tokens("r") == 0
    ctl.observe_times(plain=0.34)
    assert ctl.t_plain == 0.34 and ctl.num_spec_tokens("r") > 0


def test_expensive_verification_switches_drafting_off_for_good():
    # This CPU: verifying 4 drafts costs ~3.5 plain steps (small-M GEMMs are compute bound).
    ctl = primed(4, probe_interval=8)
    ctl.observe_times(plain=0.34, draft=0.12, verify=(4, 1.2))
    for n in range(1, 6):  # 92% acceptance, as the Qwen pair measured
        ctl.observe("r", 4, 4 if n % 3 else 3, 5 * n)
    a = ctl._requests["r"].acceptance
    best = max(expected_speedup(a, k, 0.34, 0.12, 0.34 + (1.2 - 0.34) * k / 4)
               for k in range(1, 5))
    assert best < 1
    assert ctl.num_spec_tokens("r") == 0
    assert ctl.hopeless()  # not even at the prior acceptance: no probe can pay
    for n in range(26, 200):
        ctl.note_generated("r", n)
        assert ctl.num_spec_tokens("r") == 0


# Costs where drafting pays at the prior acceptance (0.7: about 1.3x) but not for a request
# whose drafts are rejected: such a request switches off and probes.
CHEAP_DRAFT = dict(plain=0.34, draft=0.05, verify=(1, 0.40))
CHEAP_VERIFY4 = (4, 0.60)


def test_rejected_drafts_switch_drafting_off_then_probes():
    ctl = primed(4, probe_interval=8)
    ctl.observe_times(**CHEAP_DRAFT)
    ctl.observe_times(verify=CHEAP_VERIFY4)
    assert not ctl.hopeless()
    for n in range(1, 6):
        ctl.observe("r", 4, 0, 5 * n)
    a = ctl._requests["r"].acceptance
    assert max(expected_speedup(a, k, 0.34, 0.05, ctl._verify_cost(k, 0.34))
               for k in range(1, 5)) < 1
    assert ctl.num_spec_tokens("r") == 0
    ctl.note_generated("r", 5 * 5 + 7)
    assert ctl.num_spec_tokens("r") == 0  # fewer than probe_interval tokens since
    ctl.note_generated("r", 5 * 5 + 8)
    assert ctl.num_spec_tokens("r") == 1  # a probe


@pytest.mark.parametrize("verify", [0.40, 0.60])
def test_cheap_verification_picks_the_k_with_the_best_expected_speedup(verify):
    ctl = primed(6)
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
    # (no plain steps are simulated here: the yardstick refresh is tested below)
    ctl = primed(4, probe_interval=32, max_probe_interval=256,
                              refresh_interval=10**9)
    ctl.observe_times(**CHEAP_DRAFT)
    ctl.observe_times(verify=CHEAP_VERIFY4)
    for n in range(1, 4):
        ctl.observe("r", 4, 0, n)
    assert ctl.num_spec_tokens("r") == 0  # drafting off at 3 tokens
    waits, n = [], 3
    while n < 1000:
        st = ctl._requests["r"]
        k = ctl.num_spec_tokens("r")  # decided with n tokens generated
        n += 1
        if k:
            waits.append(st.generated - st.off_since)
            ctl.observe("r", k, 0, n)  # rejected: drafting still does not pay
        else:
            ctl.note_generated("r", n)
    assert waits == [32, 64, 128, 256, 256], waits
    assert ctl.probe_wait("r") == 256
    for _ in range(30):  # verification became cheap (the costs follow): the next probe pays
        ctl.observe_times(verify=(1, 0.10))
        ctl.observe_times(verify=(4, 0.20))
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
    ctl = primed(4, probe_interval=32, max_probe_interval=512, inherit_levels=3,
                              refresh_interval=10**9)  # no plain steps simulated
    ctl.observe_times(**CHEAP_DRAFT)
    ctl.observe_times(verify=CHEAP_VERIFY4)
    for n in range(1, 4):
        ctl.observe("a", 4, 0, n)
    assert ctl.num_spec_tokens("a") == 0
    for _ in range(5):  # five failed probes on request a
        while not ctl.num_spec_tokens("a"):
            n += 1
            ctl.note_generated("a", n)
        n += 1
        ctl.observe("a", 1, 0, n)
    assert ctl._requests["a"].failed_probes == 5
    assert ctl.probe_wait("b") == 32 * 2**3  # inherited, capped at 3 doublings
    assert ctl.num_spec_tokens("b") > 0  # b starts drafting (the prior pays); off, it waits so
    for _ in range(30):  # verification became cheap
        ctl.observe_times(verify=(1, 0.10))
        ctl.observe_times(verify=(4, 0.20))
    while not ctl.num_spec_tokens("a"):
        n += 1
        ctl.note_generated("a", n)
    ctl.observe("a", 1, 1, n + 1)  # a's probe pays: the engine's level resets
    assert ctl.probe_wait("c") == 32


def test_every_request_decodes_plainly_once_per_refresh_interval():
    """After refresh_interval verification steps the next step drafts for no request (the
    engine then times a plain step); timing it lets drafting resume."""
    ctl = primed(4, refresh_interval=3)
    ctl.observe_times(plain=0.30, draft=0.03)
    for rid in ("a", "b"):
        ctl.observe(rid, 2, 2, 3)
    for _ in range(2):
        assert ctl.num_spec_tokens("a") > 0 and ctl.num_spec_tokens("b") > 0
        ctl.observe_times(verify=(2, 0.33))
    assert not ctl.refreshing and ctl.num_spec_tokens("a") > 0  # two verification steps
    ctl.observe_times(verify=(2, 0.33))
    assert ctl.refreshing
    assert ctl.num_spec_tokens("a") == 0 and ctl.num_spec_tokens("b") == 0
    assert ctl._requests["a"].off_since is None  # a refresh is not a switch-off
    ctl.observe_times(plain=0.30)
    assert not ctl.refreshing
    assert ctl.num_spec_tokens("a") > 0 and ctl.num_spec_tokens("b") > 0


def test_a_stale_yardstick_is_replaced_and_unprofitable_drafting_stops():
    """The measured case (Qwen2.5-Coder 1.5B / 0.5B, 2-core AVX2 machine, a chat prompt):
    t_plain timed once at 57 ms, the plain steps then taking 40 ms, a draft forward 21 ms,
    verifying one draft 47.5 ms, 58% acceptance. By the stale yardstick drafting pays (1.3x);
    by the refreshed one it does not (0.92x), and drafting stops within a few refreshes."""
    ctl = primed(4, refresh_interval=16)
    ctl.observe_times(plain=0.057, draft=0.021, verify=(1, 0.0475))
    ctl.observe_times(verify=(2, 0.066))
    for n in range(40):  # 7 of every 12 drafts accepted (58%), spread evenly, at k = 1
        ctl.observe("r", 1, 1 if (n * 7) % 12 < 7 else 0, n + 1)
    a = ctl._requests["r"].acceptance
    assert 0.4 < a < 0.75
    stale = max(expected_speedup(a, k, 0.057, 0.021, ctl._verify_cost(k, 0.057))
                for k in range(1, 5))
    fresh = max(expected_speedup(a, k, 0.040, 0.021, ctl._verify_cost(k, 0.040))
                for k in range(1, 5))
    assert stale > 1.05 and fresh < 0.97
    steps = 0
    while ctl.num_spec_tokens("r") != 0 or ctl.refreshing:
        if ctl.refreshing:
            ctl.observe_times(plain=0.040)
        else:
            ctl.observe_times(verify=(1, 0.0475))
        steps += 1
        assert steps < 6 * 17, "drafting never stopped"
    assert ctl._requests["r"].off_since is not None


def test_no_probes_while_no_acceptance_could_pay():
    """The measured AVX2 costs: plain 34 ms, draft 20 ms, verifying 1 / 2 drafts 48.8 /
    64.8 ms. Even drafts that are always accepted give at most 2 * 34 / (20 + 48.8) = 0.99x,
    so once drafting is off it stays off (a probe's catch-up is pure cost); when verification
    becomes cheap, probing resumes on the usual schedule."""
    ctl = primed(4, probe_interval=8)
    ctl.observe_times(plain=0.034, draft=0.020, verify=(1, 0.0488))
    ctl.observe_times(verify=(2, 0.0648))
    ctl.observe_times(plain=0.034)
    want = max(expected_speedup(0.999, k, 0.034, 0.020, ctl._verify_cost(k, 0.034))
               for k in range(1, 5))
    assert want < 1
    assert ctl.hopeless()
    ctl.observe("r", 1, 1, 1)
    assert ctl.num_spec_tokens("r") == 0  # off: the costs say it cannot pay
    for n in range(2, 200):
        ctl.note_generated("r", n)
        assert ctl.num_spec_tokens("r") == 0, n  # and no probe
    ctl.observe_times(verify=(1, 0.036))  # verification became cheap: a probe may pay again
    ctl.observe_times(verify=(2, 0.040))
    assert not ctl.hopeless()
    assert ctl.num_spec_tokens("r") == 1  # the probe, long overdue


def test_priors_alone_never_stop_probing():
    """Before a draft forward and a verification are timed, priors that say drafting cannot
    pay are not trusted: requests still start and probe."""
    ctl = primed(4, draft_cost_ratio=1.2, probe_interval=8)
    ctl.observe_times(plain=0.034)
    assert max(ctl.speedup(1.0, k) for k in range(1, 5)) < 1 and not ctl.hopeless()


def test_a_probe_must_win_back_its_catch_up():
    """At the prior acceptance (0.7) drafting gives about 1.35x at the costs below; a
    catch-up timed at 0.4 of a plain step per token makes a probe (or a start) cost more than
    that could win back, so none happens; a cheap catch-up lets them go on."""
    def controller(catch_up_s: float | None) -> AdaptiveDraftLength:
        ctl = primed(4, probe_interval=8)
        ctl.observe_times(plain=0.034, draft=0.005, verify=(1, 0.040))
        ctl.observe_times(verify=(2, 0.045))
        ctl.observe_times(plain=0.034)
        if catch_up_s is not None:
            ctl.observe_times(catch_up=(20, 20 * catch_up_s))
        return ctl

    ctl = controller(None)
    at_prior = max(ctl.speedup(0.7, k) for k in range(1, 5))
    assert 1.25 < at_prior < 1.4
    assert not ctl.hopeless()
    assert not controller(0.034 * 0.1).hopeless()
    assert controller(0.034 * 0.4).hopeless()
    assert controller(0.034 * 0.4).t_catch_up == pytest.approx(0.034 * 0.4)


def test_no_new_request_starts_drafting_while_a_catch_up_cannot_pay():
    """A request that drafts already goes on while its estimate pays; a new one (whose first
    draft computes its whole prompt) does not start while the costs are hopeless."""
    ctl = primed(4, probe_interval=8)
    ctl.observe_times(plain=0.034, draft=0.010, verify=(1, 0.040))
    ctl.observe_times(verify=(2, 0.045))
    ctl.observe_times(plain=0.034)
    for n in range(1, 6):
        ctl.observe("a", 2, 2, 3 * n)  # every draft accepted: about 1.6x at these costs
    assert ctl.num_spec_tokens("a") > 0 and ctl.num_spec_tokens("b") > 0
    assert 1.1 < max(ctl.speedup(0.7, k) for k in range(1, 5)) < 1.3
    ctl.observe_times(catch_up=(20, 20 * 0.034 * 0.9))  # a catch-up token: 0.9 of a step
    assert ctl.hopeless()
    assert ctl.num_spec_tokens("a") > 0  # in sync: drafting goes on
    assert ctl.num_spec_tokens("b") == 0  # would first catch up on its prompt
