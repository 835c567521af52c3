"""The C++ decoder stack (``engine/models/cpu_stack.py``, ``kernels/cpu/stack_ops.cpp``)
against the Python layers it replaces (``LOCALCHAT_CPU_STACK=0``): the same ops with the same
arguments, so every logit must be the same bits, not merely close.

- SmolLM2-135M, native Q4_1 weights (the W4A8 kernels), bf16: teacher-forced logits of 64
  tokens one at a time (decode steps) and in chunks of 5 and 16 (verification rows).
- Qwen2.5-Coder-0.5B, native (int5, int6, int8 and int4 layers; ``qkv_proj`` sharded across
  layouts in half the layers, with Qwen2's q/k/v bias): the same, 40 tokens.
- The engine: two concurrent greedy requests (decode rows of two sequences) give the same
  tokens with and without the stack.
- fp32 activations (the exact fp32-activation kernels) the same, on SmolLM2 native.
- Where the stack must not run it is not built (PyTorch's int4pack kernel, which has no
  decode plan; the switch off; prefill rows), and a malformed description is refused with a
  clear error.
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.engine.quant.evaluate import EVAL_TEXT, teacher_forced_logits
from localchat.kernels import cpu

pytestmark = [pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: nothing to test")]


def _load(path, cache_dir, dtype):
    from localchat.engine.config import QuantConfig
    from localchat.engine.loader import load_model, load_model_config

    config = load_model_config(path, cache_dir)
    return load_model(path, config, dtype=dtype, device=torch.device("cpu"), max_position=512,
                      cache_dir=cache_dir, quant=QuantConfig(scheme="native"))


def _ids(path, cache_dir, n):
    from localchat.engine.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(path, cache_dir=cache_dir).encode(EVAL_TEXT)[:n]


def _both(model, ids, chunks, monkeypatch):
    """Teacher-forced logits per chunk size with the stack on, then off; asserts the stack
    was built (so the comparison is not vacuous)."""
    out = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(kernels.STACK_ENV, flag)
        with torch.inference_mode():
            out[flag] = [teacher_forced_logits(model, ids, chunk=c) for c in chunks]
        if flag == "1":
            assert model.model.cpu_stack._stack is not None
    return out["1"], out["0"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_smollm2_stack_equals_python_layers(smollm2_gguf, cache_dir, monkeypatch, dtype):
    model = _load(smollm2_gguf, cache_dir, dtype)
    ids = _ids(smollm2_gguf, cache_dir, 64 if dtype == torch.bfloat16 else 24)
    on, off = _both(model, ids, (1, 5, 16), monkeypatch)
    for a, b in zip(on, off):
        assert torch.equal(a, b)


def test_qwen_0_5b_mixed_layouts_stack_equals_python_layers(cache_dir, monkeypatch):
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.quant.sharded import ShardedLinearMethod

    path = resolve_model("qwen2.5-coder-0.5b", cache_dir=cache_dir).path
    model = _load(path, cache_dir, torch.bfloat16)
    qkv = [layer.self_attn.qkv_proj for layer in model.model.layers]
    assert any(isinstance(q.quant_method, ShardedLinearMethod) for q in qkv)
    assert all(q.bias is not None for q in qkv)
    kinds = {type(m.quant_method).__name__ for m in model.modules()
             if getattr(m, "quant_method", None) is not None}
    assert "Int5LinearMethod" in kinds
    # its Q4_K and Q6_K layers: the panel layouts where the VNNI kernels take them
    # (int4_panel.py, int6_panel.py)
    assert kinds & {"NativeInt4LinearMethod", "PanelInt4LinearMethod"}
    assert kinds & {"Int6LinearMethod", "PanelInt6LinearMethod"}
    on, off = _both(model, _ids(path, cache_dir, 40), (1, 4), monkeypatch)
    for a, b in zip(on, off):
        assert torch.equal(a, b)


def test_engine_greedy_equal_with_and_without_stack(smollm2_gguf, cache_dir, monkeypatch):
    from localchat.engine.config import EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams

    engine = LLMEngine.from_path(
        smollm2_gguf, EngineConfig(device="cpu", dtype=torch.bfloat16,
                                   quant=QuantConfig(scheme="native"),
                                   scheduler=SchedulerConfig(max_model_len=512)),
        cache_dir=cache_dir)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])
               for text in ("What is the capital of France?", "Name three colours.")]

    def run(flag):
        monkeypatch.setenv(kernels.STACK_ENV, flag)
        engine.reset_prefix_cache()
        for i, ids in enumerate(prompts):
            engine.add_request(f"{flag}-{i}", ids, params)
        tokens = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens.setdefault(out.request_id[2:], []).extend(out.new_token_ids)
        return tokens

    on = run("1")
    assert engine.runner.model.model.cpu_stack._stack is not None
    assert on == run("0") and all(len(t) == 24 for t in on.values())


def test_stack_is_not_built_where_it_must_not_run(smollm2_gguf, cache_dir, monkeypatch):
    # PyTorch's int4pack kernel (LOCALCHAT_CPU_INT4=int4pack): no decode plan, no stack
    monkeypatch.setenv("LOCALCHAT_CPU_INT4", "int4pack")
    model = _load(smollm2_gguf, cache_dir, torch.bfloat16)
    ids = _ids(smollm2_gguf, cache_dir, 20)
    with torch.inference_mode():
        teacher_forced_logits(model, ids, chunk=1)
    assert model.model.cpu_stack._key is not None and model.model.cpu_stack._stack is None
    monkeypatch.delenv("LOCALCHAT_CPU_INT4")
    # the switch off, and prefill rows (more than CPU_MAX_ROWS): the Python layers
    bf16 = _load(smollm2_gguf, cache_dir, torch.bfloat16)
    monkeypatch.setenv(kernels.STACK_ENV, "0")
    with torch.inference_mode():
        teacher_forced_logits(bf16, ids, chunk=1)
    monkeypatch.setenv(kernels.STACK_ENV, "1")
    with torch.inference_mode():
        teacher_forced_logits(bf16, ids)  # one 20-row prefill
    assert bf16.model.cpu_stack._key is None


def test_malformed_descriptions_are_refused():
    stack = torch.classes.localchat_cpu.DecoderStack(2, 1, 16, 0.25, 1e-5, cpu.active_isa())
    lid = stack.begin_linear(None)
    w = torch.zeros(4, 16)
    with pytest.raises(RuntimeError, match="no input slot"):
        stack.add_part(lid, "float_matmul", "tni", [w], [0], [])
    with pytest.raises(RuntimeError, match="left over"):
        stack.add_part(lid, "float_matmul", "xtnib", [w, w], [0, 0], [])
    with pytest.raises(RuntimeError, match="bad pattern"):
        stack.add_part(lid, "float_matmul", "xtq", [w], [], [])
    with pytest.raises(RuntimeError, match="no_such_op"):
        stack.add_part(lid, "no_such_op", "x", [], [], [])
    with pytest.raises(RuntimeError, match="is empty"):
        stack.add_layer(torch.ones(32), lid, lid, torch.ones(32), lid, lid,
                        torch.zeros(8, 16), torch.zeros(2, 1, 16, 1, 16))
    with pytest.raises(RuntimeError, match="no layers"):
        stack.forward(torch.zeros(1, 32), torch.zeros(1, dtype=torch.long),
                      torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.int32),
                      torch.ones(1, dtype=torch.int32), None)
