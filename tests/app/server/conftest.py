"""Fixtures for the server tests: one AsyncLLMEngine on SmolLM2 (fp32, 2048-token context)
shared by every server test, served by uvicorn on 127.0.0.1 in a background thread; the
subprocess environment; and the ``ScriptedEngine`` app of the request-edge tests
(``scripted.py``: ``tokenizer``, ``engine``, ``client``)."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from tests.app.server.live import ServerThread
from tests.app.server.scripted import ScriptedEngine, make_app

MODEL_ID = "smollm2-135m"
API_KEY = "test-key-5d1f"


@pytest.fixture(scope="session")
def async_engine(smollm2_gguf, cache_dir):
    from localchat.engine.async_engine import AsyncLLMEngine
    from localchat.engine.config import EngineConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", dtype=torch.float32,
                          scheduler=SchedulerConfig(max_model_len=2048, max_num_seqs=16))
    engine = AsyncLLMEngine(LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir))
    yield engine
    engine.shutdown()


def serve(engine, **options) -> ServerThread:
    from localchat.app.server.routes import ServerOptions, create_app

    return ServerThread(create_app(engine, ServerOptions(model_id=MODEL_ID, **options))).start()


@pytest.fixture(scope="session")
def live_server(async_engine):
    """``ServerThread`` with no API key."""
    server = serve(async_engine)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keyed_server(async_engine):
    """``ServerThread`` that requires ``API_KEY``."""
    server = serve(async_engine, api_key=API_KEY)
    yield server
    server.stop()


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A subprocess environment with a fresh LOCALCHAT_HOME whose cache links to the shared
    model cache (no other LOCALCHAT_ variable, no colour switches)."""
    import os

    from localchat.app import settings

    home = tmp_path / "home"
    home.mkdir()
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("LOCALCHAT_") and k not in ("FORCE_COLOR", "NO_COLOR")}
    e["LOCALCHAT_HOME"] = str(home)
    return e


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf, cache_dir):
    from localchat.engine.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache_dir)


@pytest.fixture
def engine(tokenizer):
    return ScriptedEngine(tokenizer)


@pytest.fixture
def client(engine):
    with TestClient(make_app(engine), raise_server_exceptions=False) as c:
        yield c
