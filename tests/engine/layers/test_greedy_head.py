"""``layers/greedy_head.py``: greedy tokens from one integer-dot pass of a quantized output
layer plus exact rescoring of the candidates its error bound admits.

Independent references: the bound buffer against ``sum |w|`` over gguf's own dequantization
of the same blocks; each token against the argmax of ``x @ w.T`` in float64 over those
weights (ties never arise except where rows are built equal; there the lower id). Layers of
near-duplicate rows make the one-pass argmax wrong at many rows, so a token taken from the
one-pass logits instead of the rescoring fails the test. Rows with more candidates than
``max_candidates`` (many equal top rows, or the cap lowered to 0) take the two-pass
fallback and must give the same tokens. Rows of a batched call equal the one-row calls.
On the real model (SmolLM2, Q8_0 tied head): the cached load carries the bound the weights
give, and over 256 teacher-forced positions the greedy tokens equal the argmax of the exact
kernel's logits wherever its top two differ by more than fp32 rounding.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from localchat import kernels
from localchat.engine.layers import greedy_head
from localchat.engine.layers.linear import Linear
from localchat.engine.quant.native import native_method, repack_into_rows
from localchat.kernels import cpu
from tests.engine.quant.test_gguf_repack import _random_blocks

pytestmark = pytest.mark.skipif(not cpu.available(), reason="the integer-dot kernels are C++")

Q4_0, Q8_0, Q6_K = 2, 8, 14
LAYOUTS = {  # the loader's layouts for these types (engine/loader/native.py: _layout_of)
    Q4_0: ("int4", 32, True, torch.float16),
    Q8_0: ("int8", 32, False, torch.float16),
    Q6_K: ("int6", 16, False, torch.int8),
}


def _layer(raw: np.ndarray, ggml_type: int, n: int, k: int) -> tuple[Linear, torch.Tensor]:
    """A native layer holding ``raw`` GGUF blocks ``[n, row_bytes]`` with its bound filled,
    and gguf's dequantization of the blocks ``[n, k]`` float64."""
    layer = Linear(k, n)
    layer.quant_method = native_method([LAYOUTS[ggml_type]], "cpu")
    layer.quant_method.create_weights(layer, "cpu")
    assert repack_into_rows(layer, raw, ggml_type, (n, k), 0, n)
    layer.process_weights_after_loading()
    greedy_head.add_bound_buffer(layer, "cpu")
    greedy_head.fill_bound(layer)
    w = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(ggml_type))
    return layer, torch.from_numpy(np.asarray(w, dtype=np.float64)).reshape(n, k)


def _near_duplicates(ggml_type: int, n: int, k: int, seed: int):
    """Gaussian rows in groups of 8 equal rows plus 3e-3 noise each: after quantization the
    group's logits differ by less than the one-pass error."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(n // 8, 1, k, generator=gen)
    w = base + 3e-3 * torch.randn(n // 8, 8, k, generator=gen)
    raw = gguf.quants.quantize(w.reshape(n, k).numpy(), gguf.GGMLQuantizationType(ggml_type))
    return _layer(raw, ggml_type, n, k)


def _tokens(layer, x):
    with kernels.a8_fp32():
        return greedy_head.greedy_token_ids(layer, x)


@pytest.mark.parametrize("ggml_type", [Q4_0, Q8_0, Q6_K], ids=["Q4_0", "Q8_0", "Q6_K"])
def test_bound_is_the_largest_block_abs_sum(ggml_type):
    n, k = 70, 512
    layer, w = _layer(_random_blocks(ggml_type, n, k, seed=3), ggml_type, n, k)
    want = w.abs().view(n, -1, 32).sum(-1).amax(0)
    got = getattr(layer, greedy_head.BUFFER)
    assert got.shape == (k // 32,) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("ggml_type", [Q4_0, Q8_0], ids=["Q4_0", "Q8_0"])
def test_tokens_are_the_exact_argmax_where_one_pass_is_wrong(ggml_type):
    n, k, rows = 512, 256, 400
    layer, w = _near_duplicates(ggml_type, n, k, seed=1)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2))
    x[:, ::32] *= 30  # an outlier channel per block, as hidden states have: coarse int8 steps
    want = (x.double() @ w.T).argmax(-1)
    with kernels.a8_fp32():  # decode-sized calls (more rows would take the exact prefill)
        one_pass = torch.cat([layer.quant_method.apply(layer, x[i:i + 16])
                              for i in range(0, rows, 16)]).argmax(-1)
    assert int((one_pass != want).sum()) >= 5  # the filter has work to do (15-30 here)
    assert torch.equal(_tokens(layer, x), want)


def test_tokens_on_int6_blocks_are_the_exact_argmax():
    n, k = 300, 512
    layer, w = _layer(_random_blocks(Q6_K, n, k, seed=4), Q6_K, n, k)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(5))
    assert torch.equal(_tokens(layer, x), (x.double() @ w.T).argmax(-1))


def test_many_candidates_take_the_two_pass_fallback(monkeypatch):
    n, k = 512, 256
    layer, _ = _near_duplicates(Q8_0, n, k, seed=6)
    # 100 copies of row 40 and x along it: more candidates than max_candidates (64)
    layer.qweight[200:300] = layer.qweight[40].clone()
    layer.scales[200:300] = layer.scales[40].clone()
    greedy_head.fill_bound(layer)
    w = layer.quant_method.embed(layer, torch.arange(n), torch.float32).double()
    x = torch.cat([w[40:41].float(), torch.randn(20, k, generator=torch.Generator().manual_seed(7))])
    calls = []
    two_pass = kernels.a8_two_pass
    monkeypatch.setattr(kernels, "a8_two_pass", lambda fn, z: calls.append(1) or two_pass(fn, z))
    tokens = _tokens(layer, x)
    assert calls  # row 0 took the fallback
    assert torch.equal(tokens, (x.double() @ w.T).argmax(-1))  # ties: the lowest id
    # every row through the fallback: the same tokens
    monkeypatch.setattr(greedy_head, "max_candidates", lambda layer: 0)
    assert torch.equal(_tokens(layer, x), tokens) and len(calls) > len(x)


def test_rows_are_batch_invariant():
    n, k = 512, 256
    layer, _ = _near_duplicates(Q8_0, n, k, seed=8)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(9))
    batched = _tokens(layer, x)
    assert torch.equal(batched, torch.cat([_tokens(layer, x[i:i + 1]) for i in range(len(x))]))


def test_real_model_greedy_tokens_are_the_exact_argmax(smollm2_gguf, smollm2_engine,
                                                       cache_dir):
    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model
    from localchat.engine.quant.evaluate import EVAL_TEXT, teacher_forced_logits

    model = load_model(smollm2_gguf, smollm2_engine.model_config, dtype=torch.float32,
                       device=torch.device("cpu"), max_position=512, cache_dir=cache_dir,
                       quant=QuantConfig(scheme="native"))
    head = model.model.embed_tokens  # tied Q8_0
    assert greedy_head.has_bound(head)
    assert torch.equal(getattr(head, greedy_head.BUFFER), greedy_head.block_abs_sum_max(head))
    hidden = []
    logits_of = model.compute_logits

    def capture(h, draft=False):
        hidden.append(h.float().clone())
        return logits_of(h, draft)

    ids = smollm2_engine.tokenizer.encode(EVAL_TEXT)[:256]
    model.compute_logits = capture
    with torch.inference_mode(), kernels.a8_fp32():  # the integer-dot decode of the body
        teacher_forced_logits(model, ids, chunk=16)
    model.compute_logits = logits_of
    h = torch.cat(hidden)
    with torch.inference_mode():
        with kernels.a8_fp32(False):
            exact = head.quant_method.apply(head, h)
        with kernels.a8_fp32():
            tokens = model.greedy_token_ids(h)
            two_pass = model.compute_logits(h).argmax(-1)
    top2 = exact.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 1e-4
    assert int(decided.sum()) >= 250
    assert torch.equal(tokens[decided], exact.argmax(-1)[decided])
    assert torch.equal(two_pass[decided], exact.argmax(-1)[decided])


def test_nan_rows_give_argmax_s_answer():
    # a broken step (NaN activations): what argmax over the logits gives, not an error
    n, k = 512, 256
    layer, w = _near_duplicates(Q8_0, n, k, seed=10)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(11))
    x[1, 7] = float("nan")
    with kernels.a8_fp32():
        want = torch.max(layer.quant_method.apply(layer, x), dim=-1).indices
    tokens = _tokens(layer, x)
    assert int(tokens[1]) == int(want[1])
    assert torch.equal(tokens[[0, 2]], (x[[0, 2]].double() @ w.T).argmax(-1))
