"""The TUI's HTTP backend: ``load_async_engine`` returns an ``AsyncRemoteEngine`` when a
``localchat serve`` for the model runs (state file + ``/health``), and its async stream gives
the engine's greedy reply; with an endpoint, the model picker lists the server's
``/v1/models`` and picking one switches the chat to it."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localchat.engine.sampling_params import SamplingParams
from tests.app.server.conftest import MODEL_ID


def test_tui_loader_uses_a_running_server(live_server, async_engine, smollm2_engine, tmp_path,
                                          monkeypatch):
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
    # /health's engine object carries the served engine's EngineInfo, field for field
    assert engine.get_info() == async_engine.get_info()

    messages = [{"role": "user", "content": "Name a kind of tree."}]
    sampling = SamplingParams(temperature=0.0, max_tokens=12)

    async def run():
        outs = [out async for out in engine.generate(messages, sampling, request_id="t1")]
        cards = await engine.list_models()  # what the TUI's model picker lists
        engine.shutdown()
        return outs, cards

    outs, cards = asyncio.run(run())
    assert [(c["id"], c["max_model_len"]) for c in cards] == [(MODEL_ID, 2048)]
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


def two_model_server() -> tuple[FastAPI, list[dict]]:
    """A fake OpenAI-compatible server listing ``alpha`` (with a context) and ``beta``; each
    reply names the model the request asked for."""
    app = FastAPI()
    seen: list[dict] = []

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": "alpha", "object": "model", "owned_by": "team-a", "max_model_len": 4096},
            {"id": "beta", "object": "model", "owned_by": "team-b"}]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        seen.append(body)

        async def events():
            for piece in ["I am ", body["model"]]:
                chunk = {"choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(done)}\n\n"
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, seen


async def test_tui_picker_lists_the_endpoint_models_and_switches(tmp_path, monkeypatch):
    """With ``--endpoint`` (settings' ``endpoint``), Ctrl+O lists the server's /v1/models, and
    picking one sends the next turn to that model on the same server."""
    import os

    from localchat.app.settings import Settings
    from localchat.app.tui.app import ChatApp
    from localchat.app.tui.history import TuiStore
    from localchat.app.tui.screens.chat_screen import ChatScreen
    from localchat.app.tui.screens.model_picker import ModelPickerScreen
    from localchat.app.tui.widgets.chat_log import ChatLog
    from localchat.app.tui.widgets.prompt_input import PromptInput
    from tests.app.server.live import ServerThread
    from tests.app.tui.conftest import wait_for

    for name in list(os.environ):
        if name.startswith("LOCALCHAT_") and name != "LOCALCHAT_TEST_GGUF":
            monkeypatch.delenv(name)
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    fake, seen = two_model_server()
    server = ServerThread(fake).start()
    try:
        app = ChatApp(model="alpha", settings=Settings(endpoint=server.url),
                      store=TuiStore(":memory:"), remember_theme=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.engine is not None, timeout=30,
                           what="the connection")
            assert app.engine.remote and app.engine.model == "alpha"
            assert app.engine.max_model_len == 4096
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelPickerScreen))
            picker = app.screen
            table = picker.query_one("DataTable")
            await wait_for(pilot, lambda: table.row_count == 2, timeout=30,
                           what="the endpoint's models")
            rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(2)]
            assert rows == [["alpha (current)", "4,096 tokens", "team-a"],
                            ["beta", "-", "team-b"]]
            table.move_cursor(row=1)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            await wait_for(pilot, lambda: app.engine is not None and app.engine.model == "beta",
                           timeout=30, what="the switch")
            assert app.model_name == "beta"
            app.screen.query_one(PromptInput).focus()
            await pilot.press("h", "i", "enter")
            log = app.screen.query_one(ChatLog)
            await wait_for(pilot, lambda: log.views() and log.views()[-1].text == "I am beta"
                           and not app.screen.current.streaming, timeout=30, what="the reply")
            assert [b["model"] for b in seen] == ["beta"]
            assert seen[0]["messages"][-1] == {"role": "user", "content": "hi"}
    finally:
        server.stop()


def test_remote_info_from_another_server_knows_only_the_model_and_context():
    """A server that is not a ``localchat serve`` reports no ``engine`` object (or a broken
    one): the info has the ``/v1/models`` name and context, the rest unknown."""
    from localchat.app.server.encode import engine_info_from_json
    from localchat.app.tui.status_info import engine_fields

    for doc in (None, {}, {"dtype": "no-such-dtype", "device": "nowhere:x", "num_blocks": "3"}):
        info = engine_info_from_json(doc, "gpt-x", 8192)
        assert (info.model, info.max_model_len) == ("gpt-x", 8192)
        assert info.weight_format is None and info.dtype is None and info.device is None
        assert info.num_blocks == 0 and info.allocated_bytes is None and not info.is_quantized
        assert engine_fields(info, "gpt-x") == {"model": "gpt-x", "weight_format": None,
                                                "device": None, "max_model_len": 8192}
