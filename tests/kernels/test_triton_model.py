"""Model-level interpreter test: the tiny Llama through the Triton launchers (CPU tensors sent
there by ``LOCALCHAT_KERNELS=triton``, run by ``TRITON_INTERPRET=1``) against the same model on
the PyTorch references: a prefill, then greedy decode steps (paged decode attention), fp32, bf16
and fp16 (pre-sm_80 GPUs), weights unquantized, int8 (group-wise, with mins) and int4
(group-wise). Logits agree within the dtype's tolerance and the greedy tokens are equal. On a
GPU the same test runs natively (Triton on CUDA against the references on CPU).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from localchat import kernels
from localchat.engine.config import ModelConfig
from localchat.engine.layers.linear import Linear
from localchat.engine.models.llama import LlamaForCausalLM
from localchat.engine.quant.methods import LinearMethod
from localchat.engine.step_inputs import BatchEntry, build_batch

from .test_quant_matmul import quantize_int4, quantize_int8

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=128, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=1024,
)
BLOCK = 16
# logits: fp32 differs by summation order only; bf16 by roundings at different points, so
# relative to the logits' scale (as the kernel tests' SCALED_TOL).
LOGIT_TOL = {torch.float32: 2e-4, torch.bfloat16: 6e-2, torch.float16: 1e-2}


class _KernelQuant(LinearMethod):
    """A linear method over ``localchat.kernels`` int8/int4 ops on the shared layout."""

    def __init__(self, scheme: str, weight: torch.Tensor) -> None:
        self.scheme = scheme
        w = weight.float()
        if scheme == "int8":
            self.q, self.s, self.m = quantize_int8(w, 32, True)
        else:
            self.q, self.s, self.m, _ = quantize_int4(w, 32)

    def to(self, device):
        self.q, self.s, self.m = (t.to(device) for t in (self.q, self.s, self.m))
        return self

    def apply(self, layer, x):
        x2 = x.reshape(-1, x.shape[-1])
        op = kernels.int8_matmul if self.scheme == "int8" else kernels.int4_matmul
        y = op(x2, self.q, self.s, self.m, 32)
        return y.reshape(*x.shape[:-1], -1)


def _model(dtype, scheme, device):
    """Built as the loader builds it (default dtype set: parameters in ``dtype``, the RoPE
    table fp32), with seeded random weights."""
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            m = LlamaForCausalLM(CONFIG)
    finally:
        torch.set_default_dtype(old)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * r if "norm" in name else 0.2 * r)
    m = m.eval()
    if scheme != "none":
        for layer in m.modules():
            if isinstance(layer, Linear) and layer is not getattr(m, "lm_head", None):
                # quantized on the CPU on both sides: a GPU's rounding of w / s can land a
                # value on the other side of a .5 and change the weights being compared
                layer.quant_method = _KernelQuant(scheme, layer.weight.data.cpu()).to(device)
    return m


def _run(model, device, dtype, prompt, steps):
    """Greedy: prefill ``prompt`` then ``steps`` decode steps; returns (logits list, tokens)."""
    kv = [torch.zeros(2, 40, BLOCK, 2, 16, dtype=dtype, device=device) for _ in range(2)]
    blocks = list(range(3, 3 + 40 - 3))
    tokens, all_logits = list(prompt), []
    start, new = 0, list(prompt)
    with torch.inference_mode():
        for _ in range(steps + 1):
            ids, pos, meta, rows = build_batch([BatchEntry(blocks, start, new, "last")], BLOCK,
                                               device)
            hidden = model(ids, pos, kv, meta)
            logits = model.compute_logits(hidden[rows[0]]).float()[0]
            all_logits.append(logits.cpu())
            start = len(tokens)
            new = [int(logits.argmax())]
            tokens += new
    return all_logits, tokens[len(prompt):]


@pytest.mark.parametrize("scheme", ["none", "int8", "int4"])
# fp16: what pre-sm_80 GPUs get (schemes.default_float_dtype)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_tiny_llama_through_triton_equals_reference(monkeypatch, dtype, scheme, device):
    gen = torch.Generator().manual_seed(11)
    # 40 tokens: several KV blocks and prefill tiles (the kernel tests cover split-K lengths;
    # a 512+ token prompt costs a minute per case in the interpreter)
    prompt = torch.randint(0, 128, (40,), generator=gen).tolist()
    steps = 3
    monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    # the reference side is the PyTorch references alone (not the C++ CPU kernels, which
    # round differently in bf16 and flip a near-tie of this random tiny model)
    from localchat.kernels import cpu as cpu_kernels

    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "available", lambda: False)
        ref_logits, ref_tokens = _run(_model(dtype, scheme, "cpu"), torch.device("cpu"),
                                      dtype, prompt, steps)
    if device.type != "cuda":
        monkeypatch.setenv("LOCALCHAT_KERNELS", "triton")
    kernels.triton_available.cache_clear()
    try:
        got_logits, got_tokens = _run(_model(dtype, scheme, device), device, dtype, prompt,
                                      steps)
    finally:
        kernels.triton_available.cache_clear()
    for got, want in zip(got_logits, ref_logits):
        err = (got - want).abs().max().item()
        assert err <= LOGIT_TOL[dtype] * want.abs().max().item(), err
    assert got_tokens == ref_tokens
