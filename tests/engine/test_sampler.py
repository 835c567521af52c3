"""Sampler: greedy exactness, top-k / top-p masks, the sampled distribution, seeded rows.

References, written here independently of ``engine/sampler.py``:
- greedy: ``torch.argmax``;
- filtering: the transformers order (temperature, then top-k, then top-p on the distribution
  renormalized after top-k), done token by token in Python: sort descending, keep the k best,
  then keep a token while the mass strictly above it is <= top_p, always the top token;
- distribution: the exact probabilities of that filtered softmax, against sampled frequencies
  (chi-square and max abs difference, fixed seeds).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.sampler import Sampler, SamplingMetadata, _filter_top_k_top_p, row_argmax
from localchat.engine.sampling_params import SamplingParams

# Tiny tensors: one thread avoids OpenMP barrier stalls on a busy 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def meta(params, seeds=None):
    gens = []
    for i, _ in enumerate(params):
        seed = None if seeds is None else seeds[i]
        gens.append(None if seed is None else torch.Generator().manual_seed(seed))
    return SamplingMetadata(list(params), gens)


def reference_keep(logits_row: list[float], top_k: int, top_p: float) -> set[int]:
    """Indices kept by top-k then top-p (transformers order), computed in float64."""
    order = sorted(range(len(logits_row)), key=lambda i: -logits_row[i])
    if top_k > 0:
        order = order[:top_k]
    m = max(logits_row[i] for i in order)
    weights = [math.exp(logits_row[i] - m) for i in order]
    total = sum(weights)
    keep, before = set(), 0.0
    for rank, (i, w) in enumerate(zip(order, weights)):
        if rank == 0 or before <= top_p:
            keep.add(i)
        before += w / total
    return keep


def reference_probs(logits_row: list[float], temperature: float, top_k: int,
                    top_p: float) -> list[float]:
    scaled = [x / temperature for x in logits_row]
    keep = reference_keep(scaled, top_k, top_p)
    m = max(scaled[i] for i in keep)
    w = [math.exp(scaled[i] - m) if i in keep else 0.0 for i in range(len(scaled))]
    s = sum(w)
    return [x / s for x in w]


@pytest.mark.parametrize("vocab", [1, 17, 49152, 151936])
def test_row_argmax_equals_torch_argmax_with_ties_and_nans(vocab):
    g = torch.Generator().manual_seed(vocab)
    # integers in a small range: many ties per row, so "first maximum" is exercised
    x = torch.randint(-4, 5, (6, vocab), generator=g).float()
    x[1] = 2.0                                   # a row of one value: index 0
    x[2, vocab // 2] = float("nan")              # a NaN counts as the maximum
    x[3, -1] = float("inf")
    x[4, :] = float("-inf")
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    assert torch.equal(row_argmax(x.bfloat16()), x.bfloat16().argmax(dim=-1))


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0, top_p=0.5, top_k=3, seed=i) for i in range(6)]
    out = Sampler().sample(logits, meta(params, seeds=list(range(6))))
    assert torch.equal(out, logits.argmax(-1))


def test_greedy_rows_exact_in_a_mixed_batch():
    logits = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0) if i % 2 else SamplingParams(temperature=5.0)
              for i in range(8)]
    params[2] = SamplingParams(temperature=3.0, top_k=1)
    out = Sampler().sample(logits, meta(params, seeds=[7] * 8))
    for i in (1, 2, 3, 5, 7):
        assert out[i].item() == logits[i].argmax().item()


@pytest.mark.parametrize("temperature", [0.1, 1.0, 2.0, 100.0])
def test_top_k_one_is_argmax_at_any_temperature(temperature):
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=temperature, top_k=1, seed=i) for i in range(16)]
    out = Sampler().sample(logits, meta(params, seeds=list(range(16))))
    assert torch.equal(out, logits.argmax(-1))


@pytest.mark.parametrize("temperature", [1e-2, 1e-4, 1e-6, 1e-30])
def test_tiny_temperature_is_finite_and_argmax(temperature):
    gen = torch.Generator().manual_seed(3)
    # Logit gaps of at least 0.05 between every pair, so the argmax is a clear winner.
    logits = torch.stack([torch.randperm(200, generator=gen).float() * 0.05 for _ in range(32)])
    logits = logits * torch.tensor([1.0, -1.0] * 16)[:, None] + 40.0
    params = [SamplingParams(temperature=temperature, top_p=0.9, seed=i) for i in range(32)]
    for seeds in (list(range(32)), [None] * 32):
        out = Sampler().sample(logits, meta(params, seeds=seeds))
        assert torch.equal(out, logits.argmax(-1))
    # Extreme logits stay finite too.
    big = torch.tensor([[3e38, -3e38, 0.0, 1e38], [-1e30, -2e30, -3e30, -1e30 + 1e25]])
    out = Sampler().sample(big, meta([SamplingParams(temperature=temperature, seed=0)] * 2,
                                     seeds=[0, 0]))
    assert out.tolist() == [0, 3]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=1, max_size=12,
                     unique=True),
            st.integers(0, 8),
            st.floats(0.05, 1.0),
        ),
        min_size=1, max_size=4,
    )
)
def test_filter_mask_matches_reference(rows):
    vocab = max(len(r[0]) for r in rows)
    # Pad short rows with distinct very negative logits (far below the rest).
    logits = torch.tensor([r[0] + [-100.0 - j for j in range(vocab - len(r[0]))] for r in rows],
                          dtype=torch.float32)
    top_k = torch.tensor([r[1] for r in rows], dtype=torch.int64)
    top_p = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    out = _filter_top_k_top_p(logits.clone(), top_k, top_p)
    for i, (_, k, p) in enumerate(rows):
        expected = reference_keep(logits[i].tolist(), k, p)
        # Skip rows where a cumulative mass lands within float error of top_p.
        kept_probs = sorted(reference_probs(logits[i].tolist(), 1.0, k, 1.0), reverse=True)
        cums = [sum(kept_probs[:j]) for j in range(len(kept_probs))]
        if any(abs(c - p) < 1e-5 for c in cums):
            continue
        got = {j for j in range(vocab) if out[i, j] > float("-inf")}
        assert got == expected, (logits[i].tolist(), k, p)
        for j in got:
            assert out[i, j] == logits[i, j]


def test_top_p_applies_to_the_distribution_after_top_k():
    """probs [0.5, 0.3, 0.2], top_k=2, top_p=0.6: after top-k the pair renormalizes to
    [0.625, 0.375], so the second token (0.625 above it) is cut; transformers and vLLM agree."""
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    out = _filter_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.6]))
    assert torch.isfinite(out).tolist() == [[True, False, False]]
    assert reference_keep(logits[0].tolist(), 2, 0.6) == {0}


def test_filters_off_keep_everything():
    logits = torch.randn(3, 10)
    out = _filter_top_k_top_p(logits, torch.tensor([0, 10, 50]), torch.tensor([1.0, 1.0, 1.0]))
    assert torch.equal(out, logits)


def test_top_p_one_keeps_the_whole_large_vocab_beside_a_filtered_row():
    """A row with top_p == 1 (off) must be untouched even when another row in the batch turns
    filtering on: an fp32 cumsum over 150k probabilities overshoots 1.0 and used to cut
    thousands of tail tokens."""
    logits = torch.randn(2, 150_000, generator=torch.Generator().manual_seed(0)) * 3
    out = _filter_top_k_top_p(logits, torch.tensor([0, 0]), torch.tensor([1.0, 0.5]))
    assert torch.equal(out[0], logits[0])
    assert 0 < int(torch.isfinite(out[1]).sum()) < 150_000


@pytest.mark.parametrize("wide_top_k", [False, True])
@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0, 12.0])
def test_candidate_filter_equals_the_full_sort(scale, wide_top_k):
    """The CPU filter's top-k candidate path (``max_top_k`` given) keeps exactly the tokens,
    and values, the sort of the whole 49k vocabulary keeps: rows with top-k, top-p alone
    (peaked rows whose nucleus fits in 64 candidates at scale 12, 1024 at scale 3, flat ones
    that need the full sort), both, and neither, in one batch; with a top-k of 2000 the
    candidates start at 2000."""
    gen = torch.Generator().manual_seed(int(scale * 10))
    rows = [(0, 0.9), (40, 1.0), (0, 0.5), (20, 0.7), (0, 1.0), (0, 0.99)]
    rows += [(2000, 0.95)] if wide_top_k else []
    logits = torch.randn(len(rows), 49_152, generator=gen) * scale
    logits -= logits.max(dim=-1, keepdim=True).values
    top_k = torch.tensor([k for k, _ in rows])
    top_p = torch.tensor([p for _, p in rows])
    full = _filter_top_k_top_p(logits, top_k, top_p)
    fast = _filter_top_k_top_p(logits, top_k, top_p, max_top_k=int(top_k.max()))
    ref, band = _keep_float64(logits, rows)
    # fp32 masses over 49k tokens are ~1e-6 off the float64 ones: a token whose mass above
    # lies within 1e-4 of top_p may go either way, on any CPU; every other token may not
    assert int(band.sum()) <= 0.01 * int(ref.sum())
    for out in (full, fast):
        kept = torch.isfinite(out)
        assert torch.equal(kept & ~band, ref & ~band)
        assert torch.equal(out[kept], logits[kept])
    assert torch.equal(torch.isfinite(fast) & ~band, torch.isfinite(full) & ~band)
    kept = torch.isfinite(full).sum(dim=-1)
    assert kept[4] == 49_152 and kept[1] == 40 and int(kept.min()) >= 1


def _keep_float64(logits, rows):
    """The filter's kept set per row computed independently in float64 (sort, top-k, the
    renormalized softmax, mass strictly above <= top_p, the top token always), and the band
    of tokens whose mass above is within 1e-4 of top_p. Both ``[n, vocab]`` bool."""
    keep = torch.zeros(logits.shape, dtype=torch.bool)
    band = torch.zeros(logits.shape, dtype=torch.bool)
    for i, (k, p) in enumerate(rows):
        vals, idx = logits[i].double().sort(descending=True)
        n = k if k > 0 else vals.numel()
        probs = torch.softmax(vals[:n], dim=0)
        above = probs.cumsum(0) - probs
        row = above <= p if p < 1 else torch.ones(n, dtype=torch.bool)
        row[0] = True
        keep[i, idx[:n]] = row
        if p < 1:
            band[i, idx[:n]] = (above - p).abs() < 1e-4
    return keep, band


def test_tiny_temperature_resolves_a_tiny_logit_gap():
    """At T = 1e-30 a gap of 1e-6 is exp(-1e24): the top token only (a temperature clamp at
    1e-5 used to make it a coin flip)."""
    n = 2000
    logits = torch.tensor([[1.0, 1.0 + 2.0**-20, 1.0 - 2.0**-20]] * n)
    params = [SamplingParams(temperature=1e-30)] * n
    gen = torch.Generator().manual_seed(0)
    out = Sampler().sample(logits, SamplingMetadata(params, [gen] * n))
    assert torch.bincount(out, minlength=3).tolist() == [0, n, 0]


CHI2_CRIT_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}  # chi-square, p = 0.001


@pytest.mark.parametrize(
    "temperature,top_k,top_p,seeded",
    [(1.0, 0, 1.0, True), (0.7, 0, 1.0, False), (2.0, 0, 1.0, True), (1.0, 3, 1.0, True),
     (1.0, 0, 0.8, False), (1.5, 4, 0.9, True)],
)
def test_sampled_frequencies_match_filtered_softmax(temperature, top_k, top_p, seeded):
    logits_row = [1.2, 0.3, -0.5, 2.0, 0.9]
    n = 20_000
    expected = reference_probs(logits_row, temperature, top_k, top_p)
    logits = torch.tensor([logits_row] * n)
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n
    if seeded:
        gen = torch.Generator().manual_seed(1234)
        out = Sampler().sample(logits, SamplingMetadata(params, [gen] * n))
    else:
        with torch.random.fork_rng():
            torch.manual_seed(4321)
            out = Sampler().sample(logits, SamplingMetadata(params, [None] * n))
    counts = torch.bincount(out, minlength=5).tolist()
    freqs = [c / n for c in counts]
    for c, p in zip(counts, expected):
        if p == 0.0:
            assert c == 0  # filtered tokens are never drawn
    assert max(abs(f - p) for f, p in zip(freqs, expected)) < 0.01
    support = [i for i, p in enumerate(expected) if p > 0]
    chi2 = sum((counts[i] - n * expected[i]) ** 2 / (n * expected[i]) for i in support)
    if len(support) > 1:
        assert chi2 < CHI2_CRIT_P001[len(support) - 1], (chi2, freqs, expected)


def test_same_seed_same_tokens_whatever_else_is_in_the_batch():
    gen = torch.Generator().manual_seed(5)
    target = torch.randn(1, 300, generator=gen)
    p = SamplingParams(temperature=1.3, top_p=0.95, seed=42)

    def run(batch_logits, params, seeds, row):
        # Fresh per-request generators, as the runner makes them; 5 steps.
        gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
        return [Sampler().sample(batch_logits, SamplingMetadata(params, gens))[row].item()
                for _ in range(5)]

    alone = run(target, [p], [42], 0)
    others = torch.randn(3, 300, generator=gen)
    mixed = torch.cat([others[:2], target, others[2:]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=None), p,
              SamplingParams(temperature=2.0, top_k=5, seed=7)]
    with_others = run(mixed, params, [None, None, 42, 7], 2)
    assert alone == with_others
    # Not a constant: a different seed gives a different sequence.
    assert run(target, [p], [43], 0) != alone


def test_seed_reproduces_with_min_p_and_penalties_in_a_mixed_batch():
    """min-p and penalties keep the per-request seed property: a seeded row draws the same
    tokens alone and inside a batch of differently configured rows."""
    gen = torch.Generator().manual_seed(11)
    target = torch.randn(1, 300, generator=gen)
    p = SamplingParams(temperature=1.1, min_p=0.05, repetition_penalty=1.2,
                       frequency_penalty=0.3, seed=5)
    prompt, output = [1, 2, 3, 250], [7, 7, 9]

    def run(batch_logits, params, seeds, prompts, outputs, row):
        gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
        metadata = SamplingMetadata(params, gens, prompts, outputs)
        return [Sampler().sample(batch_logits, metadata)[row].item() for _ in range(5)]

    alone = run(target, [p], [5], [prompt], [output], 0)
    others = torch.randn(2, 300, generator=gen)
    mixed = torch.cat([others[:1], target, others[1:]])
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0), p,
              SamplingParams(temperature=0.9, top_k=20, min_p=0.2, seed=3)]
    with_others = run(mixed, params, [None, 5, 3], [[4], prompt, []], [[5, 6], output, [8]], 1)
    assert alone == with_others
    assert run(target, [p], [6], [prompt], [output], 0) != alone
