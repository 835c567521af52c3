"""``ScriptedEngine`` and request helpers for the in-process tests of ``localchat serve``'s
app (``test_request_bodies.py``, ``test_request_routes.py``; their fixtures are in this
folder's ``conftest.py``): SmolLM2's real tokenizer (the one that refuses a lone surrogate)
in front of a fixed reply, so no model is loaded."""

from __future__ import annotations

import json

from localchat.engine.detokenizer import IncrementalDetokenizer
from localchat.engine.outputs import EngineStats, RequestOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from tests.app.fake_engine import fake_info

MODEL_ID = "smollm2-135m"
KEY = "edge-key-9c2e"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
REPLY = " The quick brown fox jumps over the lazy dog."


class ScriptedEngine:
    """Streams ``reply``'s tokens one per output (up to ``max_tokens``), each with a
    logprob and a runner-up when asked, their text decoded as the engine decodes it
    (``IncrementalDetokenizer``: an incomplete character held back, the text ended before a
    stop string, which ends the reply); or raises ``fail`` from ``generate``. Records the
    ``SamplingParams`` it was given."""

    def __init__(self, tokenizer, *, max_model_len: int = 2048, fail=None,
                 reply: str = REPLY) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.is_running = True
        self.fail = fail
        self.reply_ids = tokenizer.encode(reply)
        self.params: list[SamplingParams] = []

    def get_stats(self) -> EngineStats:
        return EngineStats(num_running=0, num_waiting=0, num_blocks=64, block_size=16,
                           kv_cache_usage=0.0, prefix_cache_queries=0, prefix_cache_hits=0,
                           num_preemptions=0, max_model_len=self.max_model_len)

    def get_info(self):
        return fake_info(self.max_model_len)

    async def generate(self, prompt_token_ids, sampling_params, request_id=None):
        self.params.append(sampling_params)
        if self.fail is not None:
            raise self.fail
        ids = self.reply_ids[: sampling_params.max_tokens]
        detok = IncrementalDetokenizer(self.tokenizer, stop=sampling_params.stop)
        for i, tid in enumerate(ids):
            delta = detok.step([tid])
            stopped = detok.stop_matched is not None
            last = stopped or i == len(ids) - 1
            if last:
                delta += detok.flush(drop_incomplete=not stopped)
            top = None
            if sampling_params.logprobs is not None:
                top = [{tid: -0.25, (tid + 1) % self.tokenizer.vocab_size: -1.5}]
            reason = (FinishReason.STOP if stopped else FinishReason.LENGTH) if last else None
            yield RequestOutput(request_id or "r", [tid], delta, detok.text,
                                len(prompt_token_ids), i + 1, finished=last,
                                finish_reason=reason, logprobs=top)
            if last:
                return


def make_app(engine, **options):
    from localchat.app.server.routes import ServerOptions, create_app

    return create_app(engine, ServerOptions(model_id=MODEL_ID, **options))


def post(client, path, body, headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content,
                       headers={"content-type": "application/json", **(headers or {})})


def assert_error(response, status, param, code=None):
    """OpenAI's error shape with ``status``, ``param`` (and ``code`` when given)."""
    assert response.status_code == status, response.text
    doc = response.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    err = doc["error"]
    assert err["param"] == param, err
    assert isinstance(err["message"], str) and "\n" not in err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def metric(client, name):
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return None
