"""Sampler penalties, min-p and logprobs against independent references.

References, written here independently of ``engine/sampler.py``:
- repetition penalty: transformers' ``RepetitionPenaltyLogitsProcessor`` (prompt + output
  ids), and a hand-computed example;
- presence / frequency penalties: the OpenAI formula
  ``logit -= presence * (count > 0) + frequency * count`` over output tokens, in Python;
- min-p (Nguyen et al. 2024, arXiv 2407.01082): keep ``p >= min_p * max(p)``, in float64;
- logprobs: ``log_softmax`` of the penalized logits (before temperature / top-k / top-p).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from localchat.engine.sampler import (
    Sampler,
    SamplingMetadata,
    _filter_min_p,
    apply_penalties,
    apply_penalties_after_drafts,
)
from localchat.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHI2_CRIT_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}  # chi-square, p = 0.001


def ref_penalize(row: list[float], prompt: list[int], output: list[int],
                 p: SamplingParams) -> list[float]:
    """Reference penalties for one row, token by token in Python (float64)."""
    out = list(row)
    for t in set(prompt) | set(output):
        if p.repetition_penalty != 1.0:
            x = out[t]
            out[t] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
    for t, c in Counter(output).items():
        out[t] -= p.presence_penalty * (c > 0) + p.frequency_penalty * c
    return out


def random_case(seed: int, n: int, vocab: int, params: list[SamplingParams]):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * 3
    prompts = [torch.randint(0, vocab, (int(torch.randint(1, 40, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(n)]
    outputs = [torch.randint(0, vocab, (int(torch.randint(0, 30, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(n)]
    meta = SamplingMetadata(list(params), [None] * n, prompts, outputs)
    return logits, prompts, outputs, meta


# -- penalties ------------------------------------------------------------------------------


def test_penalties_hand_computed():
    """vocab 6, prompt [0, 1], output [3, 3, 4]; repetition 2, presence 0.5, frequency 0.25.

    repetition (seen {0, 1, 3, 4}): 2 -> 1, -1 -> -2, 3 -> 1.5, -2 -> -4 (2 and 5 unseen);
    output counts {3: 2, 4: 1}: 1.5 - 0.5 - 2 * 0.25 = 0.5, -4 - 0.5 - 0.25 = -4.75.
    """
    row = [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]
    logits = torch.tensor([row, row, row])
    params = [
        SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
        SamplingParams(),  # defaults: untouched
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),  # output only
    ]
    meta = SamplingMetadata(params, [None] * 3, [[0, 1]] * 3, [[3, 3, 4]] * 3)
    out = apply_penalties(logits, meta)
    assert out[0].tolist() == [1.0, -2.0, 0.5, 0.5, -4.75, 0.0]
    assert torch.equal(out[1], logits[1])
    # Presence / frequency never look at the prompt: tokens 0 and 1 stay.
    assert out[2].tolist() == [2.0, -1.0, 0.5, 2.0, -2.75, 0.0]


def test_repetition_penalty_equals_transformers_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    penalties = [1.3, 0.7, 1.0, 2.5, 1.05, 10.0]
    params = [SamplingParams(repetition_penalty=r) for r in penalties]
    logits, prompts, outputs, meta = random_case(0, len(params), 97, params)
    ours = apply_penalties(logits, meta)
    for i, r in enumerate(penalties):
        ids = torch.tensor([prompts[i] + outputs[i]])
        want = RepetitionPenaltyLogitsProcessor(penalty=r)(ids, logits[i:i + 1].clone())
        torch.testing.assert_close(ours[i:i + 1], want, rtol=0, atol=0)


def test_presence_frequency_equal_openai_formula():
    pairs = [(0.5, 0.0), (0.0, 0.7), (-1.0, 2.0), (2.0, -2.0), (0.0, 0.0), (1.2, 0.3)]
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f) for p, f in pairs]
    logits, _prompts, outputs, meta = random_case(1, len(params), 50, params)
    ours = apply_penalties(logits, meta)
    for i, (p, f) in enumerate(pairs):
        counts = Counter(outputs[i])
        want = [x - (p * (counts[t] > 0) + f * counts[t]) if counts[t] else x
                for t, x in enumerate(logits[i].tolist())]
        torch.testing.assert_close(ours[i], torch.tensor(want), rtol=1e-6, atol=1e-5)


def test_all_penalties_against_python_reference():
    params = [SamplingParams(repetition_penalty=1.4, presence_penalty=0.3,
                             frequency_penalty=0.2),
              SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.5),
              SamplingParams(temperature=0.0)]
    logits, prompts, outputs, meta = random_case(2, 3, 64, params)
    ours = apply_penalties(logits, meta)
    for i, p in enumerate(params):
        want = ref_penalize(logits[i].tolist(), prompts[i], outputs[i], p)
        torch.testing.assert_close(ours[i], torch.tensor(want), rtol=1e-6, atol=1e-5)



@pytest.mark.parametrize("num_rows", [4, 1])  # the verifier's k + 1 rows; the proposer's one
def test_penalties_after_drafts_count_the_earlier_drafts_as_output(num_rows):
    """Row i follows the first ``len(drafts) - n + 1 + i`` drafts: its penalties equal the
    Python reference with those drafts appended to the output."""
    p = SamplingParams(repetition_penalty=1.4, presence_penalty=0.6, frequency_penalty=0.3)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(num_rows, 40, generator=gen) * 3
    prompt, output, drafts = [1, 2, 3, 5], [5, 7], [7, 9, 9]
    ours = apply_penalties_after_drafts(logits, p, prompt, output, drafts)
    first = len(drafts) - num_rows + 1
    for i in range(num_rows):
        want = ref_penalize(logits[i].tolist(), prompt, output + drafts[:first + i], p)
        torch.testing.assert_close(ours[i], torch.tensor(want), rtol=1e-6, atol=1e-5)
    plain = SamplingParams(temperature=0.7)
    assert apply_penalties_after_drafts(logits, plain, prompt, output, drafts) is logits
    with pytest.raises(ValueError):
        apply_penalties_after_drafts(torch.zeros(5, 40), p, prompt, output, drafts)


def test_defaults_build_no_count_tensors(monkeypatch):
    """A batch of defaults never calls the penalty path (no [num_seqs, vocab] counts)."""
    import localchat.engine.sampler as sampler_mod

    def boom(*a, **k):
        raise AssertionError("penalty tensors built for a batch of defaults")

    monkeypatch.setattr(sampler_mod, "token_counts", boom)
    monkeypatch.setattr(sampler_mod, "apply_penalties", boom)
    logits = torch.randn(3, 40)
    params = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_p=0.9)]
    meta = SamplingMetadata(params, [None] * 3, [[1, 2]] * 3, [[3]] * 3)
    out = Sampler().forward(logits, meta)
    assert out.token_ids.shape == (3,)
    assert out.logprobs == [None, None, None]


def test_greedy_equals_top_k_one_equals_tiny_temperature_with_penalties():
    gen = torch.Generator().manual_seed(3)
    n, vocab = 16, 120
    # Distinct logits with gaps >= 0.05, positive and negative.
    logits = torch.stack([torch.randperm(vocab, generator=gen).float() * 0.05 - 3.0
                          for _ in range(n)])
    prompts = [torch.randint(0, vocab, (20,), generator=gen).tolist() for _ in range(n)]
    outputs = [torch.randint(0, vocab, (10,), generator=gen).tolist() for _ in range(n)]
    pen = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.15}
    want = [max(range(vocab), key=lambda t, i=i: ref_penalize(
        logits[i].tolist(), prompts[i], outputs[i], SamplingParams(**pen))[t])
        for i in range(n)]
    # The penalties must change the argmax somewhere, or the test proves nothing.
    assert want != logits.argmax(-1).tolist()
    for kw in ({"temperature": 0.0}, {"temperature": 1.5, "top_k": 1},
               {"temperature": 1e-6}, {"temperature": 1e-6, "top_p": 0.9, "min_p": 0.1}):
        params = [SamplingParams(**kw, **pen, seed=i) for i in range(n)]
        gens = [torch.Generator().manual_seed(i) for i in range(n)]
        out = Sampler().sample(logits, SamplingMetadata(params, gens, prompts, outputs))
        assert out.tolist() == want, kw


@pytest.mark.parametrize("temperature", [1e-8, 1e-30])
def test_tiny_temperature_with_penalties_is_finite(temperature):
    big = torch.tensor([[3e38, -3e38, 0.0, 1e36, 5.0],
                        [-1e30, -2e30, -3e30, -1e30 + 1e25, 0.5],
                        [1.0, 2.0, 3.0, 4.0, 5.0]])
    prompts = [[0, 1, 2], [0, 4], [4]]
    outputs = [[1, 3, 3], [2], [4, 4]]
    params = [SamplingParams(temperature=temperature, repetition_penalty=0.01,
                             presence_penalty=2.0, frequency_penalty=2.0, min_p=0.5,
                             logprobs=5, seed=0),
              SamplingParams(temperature=temperature, repetition_penalty=100.0, seed=1),
              SamplingParams(temperature=temperature, repetition_penalty=1.5,
                             frequency_penalty=-2.0, logprobs=2)]
    meta = SamplingMetadata(params, [torch.Generator().manual_seed(0)] * 3, prompts, outputs)
    penalized = apply_penalties(big, meta)
    assert not torch.isnan(penalized).any()
    assert torch.isfinite(penalized.max(dim=-1).values).all()
    out = Sampler().forward(big, meta)
    assert out.token_ids.tolist() == penalized.argmax(-1).tolist()
    for row in (out.logprobs[0], out.logprobs[2]):
        assert not any(math.isnan(v) for v in row.values())


# -- min-p -----------------------------------------------------------------------------------


def test_min_p_mask_hand_computed():
    """probs [0.4, 0.3, 0.15, 0.1, 0.05]; min_p 0.3 -> threshold 0.12: keep {0, 1, 2};
    min_p 0.2 -> 0.08: keep {0, 1, 2, 3}; min_p 1 keeps the top token only; 0 keeps all."""
    row = [math.log(p) for p in (0.4, 0.3, 0.15, 0.1, 0.05)]
    logits = torch.tensor([row] * 4)
    out = _filter_min_p(logits, torch.tensor([0.3, 0.2, 1.0, 0.0]))
    assert torch.isfinite(out).tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, False, False, False, False],
        [True] * 5,
    ]
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], logits[kept])


def ref_min_p_probs(row: list[float], temperature: float, min_p: float) -> list[float]:
    scaled = [x / temperature for x in row]
    m = max(scaled)
    w = [math.exp(x - m) for x in scaled]
    s = sum(w)
    p = [x / s for x in w]
    keep = [q if q >= min_p * max(p) else 0.0 for q in p]
    t = sum(keep)
    return [q / t for q in keep]


@pytest.mark.parametrize("temperature,min_p,seeded",
                         [(1.0, 0.2, True), (0.7, 0.1, False), (2.0, 0.5, True)])
def test_min_p_sampled_frequencies_match_renormalized_softmax(temperature, min_p, seeded):
    row = [1.2, 0.3, -0.5, 2.0, 0.9]
    n = 20_000
    expected = ref_min_p_probs(row, temperature, min_p)
    assert 0 < sum(p == 0 for p in expected) < 4  # the filter removes something, not all
    logits = torch.tensor([row] * n)
    params = [SamplingParams(temperature=temperature, min_p=min_p)] * n
    if seeded:
        gens = [torch.Generator().manual_seed(99)] * n
        out = Sampler().sample(logits, SamplingMetadata(params, gens))
    else:
        with torch.random.fork_rng():
            torch.manual_seed(7)
            out = Sampler().sample(logits, SamplingMetadata(params, [None] * n))
    counts = torch.bincount(out, minlength=5).tolist()
    for c, p in zip(counts, expected):
        if p == 0.0:
            assert c == 0
    assert max(abs(c / n - p) for c, p in zip(counts, expected)) < 0.01
    support = [i for i, p in enumerate(expected) if p > 0]
    chi2 = sum((counts[i] - n * expected[i]) ** 2 / (n * expected[i]) for i in support)
    if len(support) > 1:
        assert chi2 < CHI2_CRIT_P001[len(support) - 1], (chi2, counts, expected)


# -- logprobs --------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_penalized_logits():
    params = [SamplingParams(temperature=0.8, top_k=5, repetition_penalty=1.3,
                             frequency_penalty=0.5, logprobs=3, seed=0),
              SamplingParams(temperature=0.0, logprobs=0),
              SamplingParams(temperature=1.0),  # no logprobs
              SamplingParams(temperature=2.0, presence_penalty=1.0, logprobs=20, seed=1),
              SamplingParams(temperature=0.0, logprobs=1)]
    n, vocab = len(params), 40
    logits, prompts, outputs, meta = random_case(4, n, vocab, params)
    meta.generators = [torch.Generator().manual_seed(i) for i in range(n)]
    out = Sampler().forward(logits, meta)
    tokens = out.token_ids.tolist()
    assert out.logprobs[2] is None
    for i, p in enumerate(params):
        if p.logprobs is None:
            continue
        pen = torch.tensor(ref_penalize(logits[i].tolist(), prompts[i], outputs[i], p),
                           dtype=torch.float64)
        want = pen.log_softmax(-1)
        row = out.logprobs[i]
        assert tokens[i] in row
        top = set(want.topk(p.logprobs).indices.tolist()) if p.logprobs else set()
        assert set(row) == top | {tokens[i]}
        assert len(row) in (p.logprobs, p.logprobs + 1)
        for t, v in row.items():
            assert abs(v - want[t].item()) < 1e-5, (i, t)
    # Greedy rows: the sampled token is the top-1, so logprobs=1 gives exactly one entry.
    assert len(out.logprobs[4]) == 1 and len(out.logprobs[1]) == 1


# -- end to end on SmolLM2 --------------------------------------------------------------------

CHAT = [{"role": "user", "content": "List the days of the week, then list them again."}]


def test_greedy_repetition_penalty_equals_transformers(smollm2_engine, smollm2_oracle):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(CHAT)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=24,
                            ignore_eos=True)
    ours = list(eng.generate(ids, params))[-1].output_token_ids
    with torch.no_grad():
        ref = smollm2_oracle.generate(
            torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
            repetition_penalty=1.3,
        )[0, len(ids):].tolist()
        plain = smollm2_oracle.generate(
            torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
        )[0, len(ids):].tolist()
    assert ours == ref
    assert ref != plain  # the penalty changed the greedy text, so the test bites


def test_engine_appends_logprobs_per_token(smollm2_engine, smollm2_oracle):
    eng = smollm2_engine
    ids = eng.tokenizer.apply_chat_template(CHAT)
    rid = eng.add_request(None, ids, SamplingParams(temperature=0.0, max_tokens=4,
                                                    ignore_eos=True, logprobs=3))
    req = eng.scheduler.requests[rid]
    other = eng.add_request(None, ids[:-3], SamplingParams(temperature=0.0, max_tokens=4,
                                                           ignore_eos=True))
    other_req = eng.scheduler.requests[other]
    while eng.has_unfinished_requests():
        eng.step()
    assert len(req.output_logprobs) == len(req.output_token_ids) == 4
    assert other_req.output_logprobs == []
    for tok, row in zip(req.output_token_ids, req.output_logprobs):
        assert tok in row and len(row) == 3
        assert row[tok] == max(row.values())  # greedy: the sampled token is the top one
    with torch.no_grad():
        want = smollm2_oracle(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
    for t, v in req.output_logprobs[0].items():
        assert abs(v - want[t].item()) < 1e-3


def test_token_counts_ignore_ids_outside_the_vocab():
    from localchat.engine.sampler import token_counts

    counts = token_counts([[0, 4, 4, 5, 9], [], [1, 1, -1]], 5, torch.device("cpu"))
    assert counts.tolist() == [[1, 0, 0, 0, 2], [0] * 5, [0, 2, 0, 0, 0]]
