"""A fake streaming engine for CLI tests where the model does not matter.

``CharTokenizer`` renders a conversation as ``role:content|`` per message (one id per
character, ``assistant:`` appended as the generation prompt), so the prompt token ids an engine
receives decode back to exactly what the model would see (``decode_ids``). ``FakeEngine`` streams
a fixed reply in fixed deltas and records what it was asked.
"""

from __future__ import annotations

import time

from localchat.engine.outputs import RequestMetrics, RequestOutput
from localchat.engine.request import FinishReason


class CharTokenizer:
    """Chat template: ``role:content|`` per message; ids are the characters' code points."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.messages = [dict(m) for m in messages]
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        return [ord(c) for c in text + ("assistant:" if add_generation_prompt else "")]


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
        self.closed = False
        self.prompt_token_ids: list[int] | None = None
        self.sampling_params = None

    def generate(self, prompt_token_ids, sampling_params, request_id=None):
        self.prompt_token_ids, self.sampling_params = list(prompt_token_ids), sampling_params
        metrics = RequestMetrics(arrival_time=time.perf_counter())
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
                text += delta
                last = i == len(self.deltas) - 1
                yield RequestOutput("r", [i], delta, text, len(prompt_token_ids), i + 1,
                                    finished=last,
                                    finish_reason=FinishReason.STOP if last else None,
                                    metrics=metrics)
        finally:
            self.closed = True
