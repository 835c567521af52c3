"""``/health`` with ``--api-key``: liveness for anyone (clients find the server with it),
what is served (model, queue, the engine's ``EngineInfo``) only with the key; the clients
that read it (``find_server``, the TUI's ``AsyncRemoteEngine``) keep working with a key."""

from __future__ import annotations

import httpx

from tests.app.server.conftest import API_KEY, MODEL_ID

LIVENESS = {"status": "ok", "auth": True}


def test_keyless_and_wrong_key_callers_get_liveness_only(keyed_server):
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {API_KEY}"},
                    {"authorization": API_KEY}):
        r = httpx.get(keyed_server.url + "/health", headers=headers, timeout=30)
        assert r.status_code == 200, headers
        assert r.json() == LIVENESS, headers
        assert API_KEY not in r.text


def test_the_key_shows_the_served_engine(keyed_server, async_engine):
    from localchat.app.server.encode import engine_info_json

    r = httpx.get(keyed_server.url + "/health", timeout=30,
                  headers={"authorization": f"Bearer {API_KEY}"})
    doc = r.json()
    assert r.status_code == 200 and doc["status"] == "ok" and doc["auth"] is True
    assert doc["model"] == MODEL_ID and doc["max_model_len"] == 2048
    assert doc["engine"] == engine_info_json(async_engine.get_info())


def test_without_a_key_set_health_shows_everything(live_server, async_engine):
    from localchat.app.server.encode import engine_info_json

    doc = httpx.get(live_server.url + "/health", timeout=30).json()
    assert doc["auth"] is False and doc["model"] == MODEL_ID
    assert doc["engine"] == engine_info_json(async_engine.get_info())


def test_clients_find_and_read_a_keyed_server(keyed_server, async_engine, tmp_path,
                                              monkeypatch):
    """The state file points at the keyed server: ``find_server`` (no key: liveness) finds
    it, the TUI's backend with the key reads the engine's info from ``/health``, and without
    the key the backend choice loads in-process instead of failing."""
    from localchat.app.server import state
    from localchat.app.server.backend import choose_backend
    from localchat.app.settings import load_settings
    from localchat.app.tui.engine_host import load_async_engine

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    monkeypatch.delenv("LOCALCHAT_ENDPOINT", raising=False)
    monkeypatch.delenv("LOCALCHAT_API_KEY", raising=False)
    state.write_state(state.ServerInfo(url=keyed_server.url, model=MODEL_ID, auth=True))
    assert state.find_server(MODEL_ID) is not None
    assert choose_backend(MODEL_ID, explicit_model=True, local=False, endpoint=None,
                          settings=load_settings()) is None  # a key it lacks: in-process

    monkeypatch.setenv("LOCALCHAT_API_KEY", API_KEY)
    remote = choose_backend(MODEL_ID, explicit_model=True, local=False, endpoint=None,
                            settings=load_settings())
    assert remote is not None and remote.local_server and remote.model == MODEL_ID
    remote.close()
    engine = load_async_engine(MODEL_ID)
    assert engine.get_info() == async_engine.get_info()
