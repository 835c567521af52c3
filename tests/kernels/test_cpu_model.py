"""SmolLM2-135M (fp32, unquantized) through the C++ CPU kernels against the same model on the
PyTorch references (``localchat.kernels.cpu.available`` patched to False, which is what
``LOCALCHAT_KERNELS=reference`` does).

- Logits: a prefill of a real chat prompt, then 16 greedy decode steps (paged decode attention
  at 40..56 tokens), every step's logits within ``LOGIT_TOL`` of the reference's (absolute;
  the logits are O(10-30)). Both sides compute in fp32; they differ only by summation order
  in the norms and attention, which moves the logits by ~1e-5.
- Greedy: the engine's 128-token greedy reply is the same token for token on both paths.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.sampling_params import SamplingParams
from localchat.engine.step_inputs import BatchEntry, build_batch
from localchat.kernels import cpu

pytestmark = [pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: nothing to test"),
              pytest.mark.usefixtures("one_torch_thread")]

CHAT = [{"role": "user", "content": "Give me three tips for writing clear Python code."}]
LOGIT_TOL = 1e-3
BLOCK = 16


def _run_steps(model, config, prompt, steps):
    """Prefill ``prompt``, then ``steps`` greedy decode steps on a private KV cache; returns
    every step's logits ``[vocab]`` fp32 and the tokens."""
    num_blocks = -(-(len(prompt) + steps + 1) // BLOCK) + 2
    kv = [torch.zeros(2, num_blocks, BLOCK, config.num_kv_heads, config.head_dim)
          for _ in range(config.num_hidden_layers)]
    blocks = list(range(1, num_blocks))
    tokens, logits_all = list(prompt), []
    start, new = 0, list(prompt)
    with torch.inference_mode():
        for _ in range(steps + 1):
            ids, pos, meta, rows = build_batch([BatchEntry(blocks, start, new, "last")], BLOCK,
                                               torch.device("cpu"))
            hidden = model(ids, pos, kv, meta)
            logits = model.compute_logits(hidden[rows[0]]).float()[0]
            logits_all.append(logits)
            start = len(tokens)
            new = [int(logits.argmax())]
            tokens += new
    return logits_all, tokens[len(prompt):]


def _greedy(engine, ids, n):
    engine.reset_prefix_cache()  # no KV computed by the other path is reused
    outs = list(engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=n,
                                                    ignore_eos=True)))
    return outs[-1].output_token_ids


def test_smollm2_logits_and_greedy_equal_reference(smollm2_engine, monkeypatch):
    eng = smollm2_engine
    model = eng.runner.model
    config = eng.model_config
    ids = eng.tokenizer.apply_chat_template(CHAT)
    got_logits, got_tokens = _run_steps(model, config, ids, 16)
    got_reply = _greedy(eng, ids, 128)
    with monkeypatch.context() as m:
        m.setattr(cpu, "available", lambda: False)
        want_logits, want_tokens = _run_steps(model, config, ids, 16)
        want_reply = _greedy(eng, ids, 128)
    worst = max((g - w).abs().max().item() for g, w in zip(got_logits, want_logits))
    assert worst <= LOGIT_TOL, worst
    assert got_tokens == want_tokens
    assert len(got_reply) == 128 and got_reply == want_reply
