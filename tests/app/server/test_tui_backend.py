"""The TUI's HTTP backend: ``load_async_engine`` returns an ``AsyncRemoteEngine`` when a
``localchat serve`` for the model runs (state file + ``/health``), and its async stream gives
the engine's greedy reply."""

from __future__ import annotations

import asyncio

from localchat.engine.sampling_params import SamplingParams
from tests.app.server.conftest import MODEL_ID


def test_tui_loader_uses_a_running_server(live_server, smollm2_engine, tmp_path, monkeypatch):
    from localchat.app.server import state
    from localchat.app.server.async_client import AsyncRemoteEngine
    from localchat.app.tui.engine_host import load_async_engine

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    for name in ("LOCALCHAT_ENDPOINT", "LOCALCHAT_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    state.write_state(state.ServerInfo(url=live_server.url, model=MODEL_ID))
    engine = load_async_engine(MODEL_ID)
    assert isinstance(engine, AsyncRemoteEngine)
    assert engine.model == MODEL_ID and engine.max_model_len == 2048

    messages = [{"role": "user", "content": "Name a kind of tree."}]
    sampling = SamplingParams(temperature=0.0, max_tokens=12)

    async def run():
        outs = [out async for out in engine.generate(messages, sampling, request_id="t1")]
        engine.shutdown()
        return outs

    outs = asyncio.run(run())
    ids = smollm2_engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    last = None
    for last in smollm2_engine.generate(ids, sampling):
        pass
    assert outs[-1].finished and outs[-1].text == last.text
    assert "".join(o.text_delta for o in outs) == last.text
    assert outs[-1].num_prompt_tokens == len(ids)
    assert outs[-1].num_output_tokens == last.num_output_tokens
    assert engine.get_stats().max_model_len == 2048

    state.remove_state(pid=state.read_state().pid)
    monkeypatch.setenv("LOCALCHAT_ENDPOINT", live_server.url)
    via_endpoint = load_async_engine("a-model-the-server-lacks")
    assert via_endpoint.model == MODEL_ID  # the endpoint's first listed model
