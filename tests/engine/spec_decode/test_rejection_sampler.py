"""The rejection sampler preserves the target distribution (Leviathan et al. 2023, Thm. 1).

On an 8-token vocabulary with fixed target and draft logits, 20,000 independent trials are
run in one batched call: drafts are drawn from q, verified against p, and the emitted tokens'
empirical distribution is compared with p by a chi-square test (p-value > 0.001), for several
temperature / top-p / top-k settings; the bonus token after an accepted draft follows the
target's next distribution. The target distribution itself comes from ``sampling_probs`` (the
plain sampler's), so "equal to p" means "equal to what sampling without a draft would give".
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.request import Request
from localchat.engine.sampler import sampling_probs
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_decode.rejection_sampler import RejectionSampler, rejection_sample

TRIALS = 20_000
# Chi-square critical values at p = 0.001 by degrees of freedom.
CHI2_001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}

TARGET = torch.tensor([[2.0, 1.5, 0.3, -1.0, 0.8, 0.0, -0.5, 1.1],
                       [0.1, -0.3, 2.2, 0.5, 0.5, -2.0, 1.0, 0.0]])
DRAFT = torch.tensor([0.5, 2.5, 0.0, 0.7, -1.0, 1.5, 0.2, -0.4])


def chi_square_ok(samples: torch.Tensor, probs: torch.Tensor) -> tuple[bool, float]:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[support].double() * counts.sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat < CHI2_001[int(support.sum()) - 1], stat


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=4),
    SamplingParams(temperature=0.9, min_p=0.1),
], ids=["t1", "t0.7", "t1.3-top_p0.8", "top_k4", "min_p0.1"])
def test_emitted_tokens_follow_the_target_distribution(params):
    gen = torch.Generator().manual_seed(1234)
    p = sampling_probs(TARGET, [params, params])  # [2, 8]: position 1 and the bonus position
    q = sampling_probs(DRAFT[None], [params])[0]
    drafts = torch.multinomial(q.expand(TRIALS, -1), 1, generator=gen)  # [TRIALS, 1]
    n_acc, nxt = rejection_sample(p.expand(TRIALS, -1, -1), q.expand(TRIALS, 1, -1),
                                  drafts, gen)
    first = torch.where(n_acc == 1, drafts[:, 0], nxt)
    ok, stat = chi_square_ok(first, p[0])
    assert ok, f"first emitted token: chi2 {stat:.1f}"
    # After an accepted draft, the bonus token follows the target's next distribution.
    bonus = nxt[n_acc == 1]
    assert bonus.numel() > 2000
    ok, stat = chi_square_ok(bonus, p[1])
    assert ok, f"bonus token: chi2 {stat:.1f}"
    # The acceptance rate equals sum(min(p, q)) (Leviathan et al. 2023, section 3.3).
    rate = float(n_acc.double().mean())
    assert rate == pytest.approx(float(torch.minimum(p[0], q).sum()), abs=0.015)


def test_identical_draft_is_always_accepted():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(TARGET, -1)
    drafts = torch.multinomial(p[0].expand(1000, -1), 1, generator=gen)
    n_acc, _ = rejection_sample(p.expand(1000, -1, -1), p[:1].expand(1000, -1, -1), drafts, gen)
    assert bool((n_acc == 1).all())


def test_verify_greedy_accepts_the_argmax_prefix_then_emits_the_target_token():
    req = Request("r", [1, 2], SamplingParams(temperature=0.0))
    logits = torch.full((4, 8), -5.0)
    for pos, tok in enumerate([3, 6, 1, 7]):
        logits[pos, tok] = 5.0
    rs = RejectionSampler()
    assert rs.verify(logits, [3, 6, 1], None, req, None) == [3, 6, 1, 7]  # all + bonus
    assert rs.verify(logits, [3, 2, 1], None, req, None) == [3, 6]  # stops at the mismatch
    assert rs.verify(logits, [0, 6, 1], None, req, None) == [3]


def test_verify_applies_penalties_with_the_drafts_as_output():
    # Token 3 wins at every position unless penalized; position 1 sees draft 3 as output.
    req = Request("r", [1, 2], SamplingParams(temperature=0.0, presence_penalty=2.0))
    logits = torch.zeros(3, 8)
    logits[:, 3] = 1.5
    logits[:, 5] = 1.0
    got = RejectionSampler().verify(logits, [3, 3], None, req, None)
    assert got == [3, 5]  # the second 3 is rejected: a repeated 3 scores 1.5 - 2 < 1.0
