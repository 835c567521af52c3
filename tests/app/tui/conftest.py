"""Fixtures for TUI tests: an isolated LOCALCHAT_HOME, an in-memory history, the app factory,
and ``wait_for`` (poll a condition between Textual frames; no fixed sleeps)."""

from __future__ import annotations

import asyncio
import time

import pytest

from localchat.app.settings import Settings
from localchat.app.tui.app import ChatApp
from localchat.app.tui.history import TuiStore


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch, cache_dir):
    """Config and history under a temporary LOCALCHAT_HOME; no LOCALCHAT_* from the shell.

    Requests the session's ``cache_dir`` first, so the real model cache (where the CI model
    is) is resolved before the environment changes.
    """
    import os

    for name in list(os.environ):
        if name.startswith("LOCALCHAT_") and name != "LOCALCHAT_TEST_GGUF":
            monkeypatch.delenv(name)
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def make_app():
    """``make_app(engine, **kwargs)``: a ``ChatApp`` on an in-memory history and default
    settings (the theme is not written to the config unless ``remember_theme=True``)."""
    apps = []

    def factory(engine=None, *, settings=None, store=None, **kwargs) -> ChatApp:
        kwargs.setdefault("remember_theme", False)
        app = ChatApp(engine=engine, settings=settings or Settings(),
                      store=store or TuiStore(":memory:"), **kwargs)
        apps.append(app)
        return app

    return factory


async def wait_for(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``condition()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause()
        await asyncio.sleep(0)
