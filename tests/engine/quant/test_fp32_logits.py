"""Logits of a bf16 CPU model with a quantized output layer come out of the integer-dot kernel
in fp32 (``kernels.a8_fp32``), never rounded to bf16.

The kernels round the activations to int8 per 32 columns either way, so the fp32-widened
input must give the same integer products as the bf16 one: the fp32 logits rounded to bf16
equal the bf16 kernel's output bit for bit (its store rounds the same fp32 sum to nearest
even), and they differ from that bf16 output widened (they keep the bits bf16 drops).
Checked on an int6 (Q6_K) and an int4 (Q4_K two-level) output layer built from random GGUF
blocks, and on SmolLM2-135M's own tied Q8_0 embedding through ``compute_logits``.
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu
from tests.engine.quant import test_int6_layer, test_kscale_layer
from tests.engine.quant.test_gguf_repack import _random_blocks

pytestmark = pytest.mark.skipif(not cpu.available(), reason="the integer-dot kernels are C++")


def _check(head, x):
    """fp32 logits of ``head`` (a quantized layer) for bf16 rows ``x`` against its bf16 output."""
    want = head.quant_method.apply(head, x)
    assert want.dtype == torch.bfloat16
    with kernels.a8_fp32():
        got = head.quant_method.apply(head, x.float())
    assert got.dtype == torch.float32
    assert torch.equal(got.bfloat16(), want)
    assert not torch.equal(got, want.float())  # the bits bf16 rounds away are kept
    return got


@pytest.mark.parametrize("rows", [1, 3])
def test_int6_output_layer_gives_fp32_logits(rows):
    n, k = 40, 512
    head = test_int6_layer._layer(_random_blocks(14, n, k, seed=5), n, k)
    _check(head, torch.randn(rows, k).bfloat16())


@pytest.mark.parametrize("rows", [1, 3])
def test_int4_output_layer_gives_fp32_logits(rows):
    n, k = 48, 512
    head = test_kscale_layer._layer(_random_blocks(12, n, k, seed=6), n, k, torch.uint8)
    _check(head, torch.randn(rows, k).bfloat16())


def test_fp32_activations_keep_the_exact_kernels_outside_the_context():
    assert not kernels.cpu_a8_enabled(torch.float32) or kernels._a8_mode() == "always"
    with kernels.a8_fp32():
        assert kernels.cpu_a8_enabled(torch.float32) == (kernels._a8_mode() != "never")
    assert kernels._a8_fp32 is False


def test_smollm2_compute_logits_are_fp32_from_its_q8_0_head(smollm2_gguf, cache_dir):
    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model, load_model_config

    config = load_model_config(smollm2_gguf, cache_dir)
    model = load_model(smollm2_gguf, config, dtype=torch.bfloat16, device=torch.device("cpu"),
                       max_position=256, cache_dir=cache_dir, quant=QuantConfig(scheme="native"))
    head = model.model.embed_tokens
    assert head.weight is None  # the tied Q8_0 embedding, quantized
    torch.manual_seed(0)
    x = torch.randn(2, config.hidden_size).bfloat16()
    with torch.inference_mode():
        got = model.compute_logits(x)
        assert torch.equal(got, _check(head, x))


def test_draft_logits_take_one_integer_dot_pass(smollm2_gguf, cache_dir):
    """An fp32 model decoding through the integer-dot kernels (``kernels.a8_fp32``): its
    output layer takes two passes (``kernels.a8_two_pass``), a draft model's one
    (``compute_logits(..., draft=True)``). Against the exact fp32-activation kernel (outside
    the context): the draft's logits are the one-pass kernel's bit for bit, the target's are
    much closer to exact than those."""
    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model, load_model_config

    if kernels._a8_mode() == "never":
        pytest.skip("LOCALCHAT_CPU_A8=0: no integer-dot kernels to compare")
    config = load_model_config(smollm2_gguf, cache_dir)
    model = load_model(smollm2_gguf, config, dtype=torch.float32, device=torch.device("cpu"),
                       max_position=256, cache_dir=cache_dir, quant=QuantConfig(scheme="native"))
    head = model.model.embed_tokens
    assert head.weight is None
    x = torch.randn(3, config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        exact = model.compute_logits(x)
        with kernels.a8_fp32():
            one_pass = head.quant_method.apply(head, x)
            draft = model.compute_logits(x, draft=True)
            target = model.compute_logits(x)
    assert torch.equal(draft, one_pass)
    err_draft = (draft - exact).abs().max().item()
    err_target = (target - exact).abs().max().item()
    assert err_draft > 0.01 and err_target < err_draft / 20
