"""A fake streaming engine for CLI tests where the model does not matter.

``CharTokenizer`` renders a conversation as ``role:content|`` per message (one id per
character, ``assistant:`` appended as the generation prompt), so the prompt token ids an engine
receives decode back to exactly what the model would see (``decode_ids``). ``FakeEngine`` streams
a fixed reply in fixed deltas and records what it was asked.
"""

from __future__ import annotations

import time

import torch

from localchat.engine.config import ModelConfig
from localchat.engine.outputs import EngineInfo, RequestMetrics, RequestOutput
from localchat.engine.request import FinishReason


class CharTokenizer:
    """Chat template: ``role:content|`` per message; ids are the characters' code points."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.messages = [dict(m) for m in messages]
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        return [ord(c) for c in text + ("assistant:" if add_generation_prompt else "")]


# A small Llama shape: what the memory report re-plans for a fake engine.
FAKE_MODEL_CONFIG = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096)


def fake_info(max_model_len: int, num_blocks: int = 64, block_size: int = 16) -> EngineInfo:
    """The ``EngineInfo`` of a fake engine: an fp32 model "fake" on the CPU, no draft."""
    return EngineInfo(model="fake", weight_format="fp32", dtype=torch.float32,
                      device=torch.device("cpu"), max_model_len=max_model_len,
                      num_blocks=num_blocks, block_size=block_size, kv_cache_bytes=0)


def decode_ids(ids) -> str:
    """The text a ``CharTokenizer`` rendered into ``ids``."""
    return "".join(chr(i) for i in ids)


class FakeEngine:
    """Streams ``deltas``; sleeps ``delay`` seconds before each; raises KeyboardInterrupt
    before delta number ``interrupt_after`` (to simulate Ctrl+C)."""

    def __init__(self, deltas, *, delay: float = 0.0, interrupt_after: int | None = None,
                 max_model_len: int = 4096) -> None:
        self.tokenizer = CharTokenizer()
        self.deltas, self.delay, self.interrupt_after = list(deltas), delay, interrupt_after
        self.max_model_len = max_model_len
        self.model_config = FAKE_MODEL_CONFIG
        self.closed = False
        self.prompt_token_ids: list[int] | None = None
        self.sampling_params = None

    def get_info(self) -> EngineInfo:
        return fake_info(self.max_model_len)

    def generate(self, prompt_token_ids, sampling_params, request_id=None):
        self.prompt_token_ids, self.sampling_params = list(prompt_token_ids), sampling_params
        metrics = RequestMetrics(arrival_time=time.perf_counter(),
                                 num_prompt_tokens=len(prompt_token_ids))
        metrics.first_scheduled_time = metrics.arrival_time
        text = ""
        try:
            for i, delta in enumerate(self.deltas):
                if self.delay:
                    time.sleep(self.delay)
                if i == self.interrupt_after:
                    raise KeyboardInterrupt
                now = time.perf_counter()
                if metrics.first_token_time is None:
                    metrics.first_token_time = now
                metrics.last_token_time = now
                metrics.num_output_tokens = i + 1
                text += delta
                last = i == len(self.deltas) - 1
                yield RequestOutput("r", [i], delta, text, len(prompt_token_ids), i + 1,
                                    finished=last,
                                    finish_reason=FinishReason.STOP if last else None,
                                    metrics=metrics)
        finally:
            self.closed = True
