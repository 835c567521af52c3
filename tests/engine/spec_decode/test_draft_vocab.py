"""The draft's vocabulary (``SpeculativeConfig.draft_vocab_size``: the first n token ids,
``compute_logits(vocab_size=n)``) on the tiny random models of ``test_spec_decode``: drafts
stay inside it, greedy output stays plain greedy's token for token, and the logits over the
prefix equal the whole output layer's; ``SpeculativeConfig`` rejects bad values."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.config import SpeculativeConfig

from .test_spec_decode import PROMPTS, build, generate, plain_outputs, tiny  # noqa: F401


def test_a_draft_vocabulary_drafts_its_tokens_only_and_keeps_greedy_output(  # noqa: F811
        tiny, plain_outputs):  # noqa: F811
    """``draft_vocab_size=64`` of the 256 tokens, the target as its own draft: every draft
    is below 64 (the draft's argmax over its vocabulary), greedy output is plain greedy's,
    and a draft is rejected exactly where the target's token lies past the vocabulary."""
    eng = build(tiny, 4, draft="target", draft_vocab=64)
    proposer = eng.speculator.proposer
    proposed: list[int] = []
    propose = proposer.propose

    def spy(*args, **kwargs):
        out = propose(*args, **kwargs)
        proposed.extend(t for tokens in out.values() for t in tokens)
        return out

    proposer.propose = spy
    got = {rid: generate(eng, {rid: ids})[rid] for rid, ids in PROMPTS.items()}
    assert got == plain_outputs
    assert proposed and max(proposed) < 64
    stats = eng.get_stats().spec
    outside = any(t >= 64 for out in plain_outputs.values() for t in out)
    assert outside  # (the tiny target's outputs reach past the vocabulary, so it bites)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_compute_logits_over_a_vocabulary_prefix(tiny):  # noqa: F811
    """``compute_logits(vocab_size=n)``: the first n logits of the whole output layer's (a
    float ``[n, K]`` weight slice: the same dot products), the rest -inf."""
    eng = build(tiny, None)
    model = eng.runner.model
    hidden = torch.randn(3, model.config.hidden_size)
    full = model.compute_logits(hidden, draft=True)
    part = model.compute_logits(hidden, draft=True, vocab_size=64)
    assert part.shape == full.shape
    torch.testing.assert_close(part[:, :64], full[:, :64], rtol=1e-5, atol=1e-5)
    assert bool((part[:, 64:] == float("-inf")).all())
    assert torch.equal(model.compute_logits(hidden, vocab_size=10_000), full)


@pytest.mark.parametrize("field,value,match", [
    ("num_speculative_tokens", 0, "between 1 and 16"),
    ("num_speculative_tokens", 17, "between 1 and 16"),
    ("method", "medusa", "must be one of"),
    ("draft_vocab_size", 0, "must be positive"),
])
def test_speculative_config_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig(draft_model="d", **{field: value})


@pytest.mark.parametrize("transposed", [False, True])
def test_apply_prefix_of_a_float_layer_is_its_first_outputs(transposed):
    """``LinearMethod.apply_prefix``: a float ``[N, K]`` weight, and the CPU's fp32 ``[K, N]``
    copy (``weight_t``, what a float32 draft's output layer holds), read only their first n
    outputs; against the whole layer's outputs, cut."""
    from localchat.engine.layers.linear import Linear

    gen = torch.Generator().manual_seed(0)
    layer = Linear(48, 80, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(80, 48, generator=gen))
        layer.bias.copy_(torch.randn(80, generator=gen))
    if transposed:
        layer.quant_method.process_weights_after_loading(layer)
        assert layer.weight is None and layer.weight_t is not None
    x = torch.randn(20, 48, generator=gen)  # past the C++ decode rows: torch.mm either way
    want = layer.quant_method.apply(layer, x)[:, :24]
    got = layer.quant_method.apply_prefix(layer, x, 24)
    assert got.shape == (20, 24)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
