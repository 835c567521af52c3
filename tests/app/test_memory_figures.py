"""``ask --json``'s memory figures and the model picker's plan agree with the engine as loaded
(issue 18: one plan, one context; "measured" is what was allocated).

References: the KV pool's size from the model config and the pool's shape
(layers x 2 x tokens x num_kv_heads x head_dim x dtype bytes), the engine's own
``max_model_len``; the planner's prediction must match the allocation closely (it is a
formula over the same shapes; the bound leaves room for small buffers such as RoPE tables).
"""

from __future__ import annotations

import torch

from localchat.app.memory_figures import memory_figures
from localchat.engine.memory.report import allocated_bytes


def test_allocated_bytes_counts_each_storage_once():
    w = torch.zeros(10, 4)
    assert allocated_bytes([w, w, w[:2], torch.zeros(3, dtype=torch.int8)]) == 160 + 3


def test_ask_json_memory_matches_the_engine(smollm2_engine):
    engine = smollm2_engine
    fig = memory_figures(engine)
    c = engine.model_config
    pool_tokens = engine.num_blocks * engine.config.cache.block_size
    kv_reference = (c.num_hidden_layers * 2 * pool_tokens * c.num_kv_heads * c.head_dim
                    * torch.empty((), dtype=engine.dtype).element_size())
    assert fig["context"] == engine.max_model_len == 2048
    assert fig["kv_pool_tokens"] == pool_tokens
    assert fig["kv_bytes"] == kv_reference
    assert fig["predicted_bytes"] == fig["weight_bytes"] + fig["kv_bytes"]
    assert fig["measured_bytes"] >= kv_reference + fig["weight_bytes"] * 0.9
    assert abs(fig["measured_bytes"] - fig["predicted_bytes"]) <= 0.05 * fig["predicted_bytes"]
    assert "allocated" in fig["measured"]


def test_model_picker_plans_the_engines_context(smollm2_gguf, cache_dir):
    from localchat.app.plan_cli import default_context
    from localchat.app.tui.engine_host import plan_for
    from localchat.engine.loader import load_model_config

    trained = load_model_config(smollm2_gguf, cache_dir).max_position_embeddings
    expected = default_context(trained, "cuda" if torch.cuda.is_available() else "cpu")
    text = plan_for(smollm2_gguf)
    assert text is not None and f"at {expected} tokens of context" in text
    assert "at 1024 tokens of context" in plan_for(smollm2_gguf, 1024)
