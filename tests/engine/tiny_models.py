"""Tiny random checkpoints of every supported architecture, saved as HF safetensors folders.

transformers' own modeling code on the same weights is the logits oracle.
"""

from __future__ import annotations

from pathlib import Path

import torch

ARCHS = ("llama", "llama3_scaled", "mistral", "qwen2", "qwen3")


def make_config(arch: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    }
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True, rope_theta=10000.0)
    if arch == "llama3_scaled":
        return LlamaConfig(**common, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if arch == "mistral":
        return MistralConfig(**common, head_dim=32, sliding_window=None)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1000000.0)
    if arch == "qwen3":
        return Qwen3Config(**{**common, "num_attention_heads": 4}, head_dim=24,
                           rope_theta=1000000.0)
    raise ValueError(arch)


def save_tiny_model(arch: str, folder: Path, seed: int = 0):
    """Random-init the HF model for ``arch``, save it to ``folder``; return the HF model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = make_config(arch)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # make biases and norms non-trivial so a dropped one shows up
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    return model
