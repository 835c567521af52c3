"""Stage 3's side-by-side for ``gpu_engine_e2e.py``: the engine's random Llama weights mapped
into transformers' ``LlamaForCausalLM`` (built from a ``LlamaConfig``, no download), its
``generate`` timed at batch 1, and how many leading greedy tokens the engine shares with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench_e2e import sync

from localchat.engine.config import ModelConfig
from localchat.engine.llm_engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams


def hf_llama_from(model, cfg: ModelConfig, device, dtype=torch.bfloat16):
    """transformers' ``LlamaForCausalLM`` from a ``LlamaConfig`` (no download) holding
    ``model``'s weights (the fused ``qkv_proj`` / ``gate_up_proj`` split back into HF's
    names). Raises ``ImportError`` without transformers, ``ValueError`` when a weight does not
    map."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    hcfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, rope_scaling=cfg.rope_scaling,
        tie_word_embeddings=False)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = HFLlama(hcfg)
    finally:
        torch.set_default_dtype(before)
    q, kv = cfg.q_size, cfg.kv_size
    sd = {}
    from localchat.engine.layers.linear import Linear

    weights = {k: v for k, v in model.state_dict().items() if "cos_sin_cache" not in k}
    for mname, mod in model.named_modules():  # fp32 on CPU keeps only ``weight_t [in, out]``
        w = getattr(mod, "weight", None)
        if isinstance(mod, Linear) and not isinstance(w, torch.Tensor):
            weights[mname + ".weight"] = mod.weight_t.t()
    for name, t in weights.items():
        if "qkv_proj.weight" in name:
            b = name.replace("qkv_proj.weight", "")
            sd[b + "q_proj.weight"], sd[b + "k_proj.weight"], sd[b + "v_proj.weight"] = \
                t.split([q, kv, kv])
        elif "gate_up_proj.weight" in name:
            b = name.replace("gate_up_proj.weight", "")
            sd[b + "gate_proj.weight"], sd[b + "up_proj.weight"] = t.chunk(2)
        else:
            sd[name] = t
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"weight mapping failed: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return hf.eval()


def hf_generate(model, cfg: ModelConfig, args, device) -> dict:
    """transformers' ``generate`` (greedy, batch 1, ``--steps`` new tokens after a
    ``--context`` prompt) on ``hf_llama_from(model)``; decode tok/s = (new tokens - 1) /
    (generate time - the time of a 1-token generate). Returns ``{"skipped": why}`` without
    transformers."""
    try:
        import transformers
    except ImportError as err:
        return {"skipped": f"transformers not importable here ({err})"}
    hf = hf_llama_from(model, cfg, device)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size - 1, (1, args.context), generator=gen).to(device)
    kw = {"do_sample": False, "min_new_tokens": args.steps, "max_new_tokens": args.steps,
          "pad_token_id": 0}
    with torch.inference_mode():
        hf.generate(prompt, **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})  # warm-up
        sync(device)
        t0 = time.perf_counter()
        hf.generate(prompt, **{**kw, "min_new_tokens": 1, "max_new_tokens": 1})
        sync(device)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = hf.generate(prompt, **kw)
        sync(device)
        total = time.perf_counter() - t0
    new = out.shape[1] - args.context
    decode_s = max(total - prefill, 1e-9)
    del hf
    return {"transformers": transformers.__version__, "new_tokens": new,
            "tok_per_s": (new - 1) / decode_s, "generate_s": total, "prefill_s": prefill,
            "prompt": prompt[0].tolist(), "tokens": out[0, args.context:].tolist()}


def greedy_agreement(engine: LLMEngine, prompt: list[int], ref: list[int]) -> int:
    """How many leading greedy tokens the engine shares with ``ref`` (transformers' on the
    same weights and prompt). Information only: random bf16 weights make near-ties, where
    two correct implementations may part."""
    outs = list(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=len(ref),
                                                       ignore_eos=True)))
    ours = outs[-1].output_token_ids
    n = 0
    while n < min(len(ours), len(ref)) and ours[n] == ref[n]:
        n += 1
    return n
