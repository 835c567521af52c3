"""The TUI on the real engine: SmolLM2-135M (the CI model) behind ``AsyncLLMEngine``.

A two-turn chat: the status bar shows 0 cached tokens on turn 1 (after a prefix-cache reset)
and, on turn 2, at least the whole blocks of the prompt that turn 1 already computed (the
reference is the common prefix of the two prompts rendered independently with the chat
template, rounded down to ``block_size``).
"""

from __future__ import annotations

import pytest

from localchat.app.session import ChatSession
from localchat.app.settings import Settings
from localchat.app.tui.screens.chat_screen import ChatScreen
from localchat.app.tui.widgets.status_bar import StatusBar
from tests.app.tui.conftest import wait_for


@pytest.fixture
def async_smollm2(smollm2_engine):
    """The session's SmolLM2 engine driven by an ``AsyncLLMEngine`` thread for one test (the
    thread hands the engine back at shutdown)."""
    from localchat.engine.async_engine import AsyncLLMEngine

    engine = AsyncLLMEngine(smollm2_engine)
    engine.reset_prefix_cache()
    yield engine
    engine.shutdown()


async def test_two_turn_chat_shows_cached_tokens(make_app, async_smollm2):
    settings = Settings(sampling={"temperature": 0.0, "max_tokens": 8})
    app = make_app(async_smollm2, settings=settings, model="smollm2-135m")
    block = async_smollm2.engine.config.cache.block_size
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        bar = screen.query_one(StatusBar)

        async def turn(text: str, n_messages: int) -> None:
            screen.query_one("#prompt").focus()
            await pilot.press(*[{" ": "space"}.get(c, c) for c in text], "enter")
            await wait_for(pilot, lambda: len(screen.current.messages) == n_messages
                           and not screen.current.streaming, timeout=60, what="the reply")

        await turn("Name a colour.", 2)
        assert bar.info.cached_tokens == 0
        assert "│ cpu │" in bar.plain and "cached 0/" in bar.plain
        reply = screen.current.messages[1]
        assert reply.content.strip() and not reply.interrupted
        assert 1 <= reply.stats["usage"]["completion_tokens"] <= 8

        await turn("Another one.", 4)
        tok = async_smollm2.tokenizer
        first = ChatSession(messages=[{"role": "user", "content": "Name a colour."}])
        second = ChatSession(messages=[{"role": m.role, "content": m.content}
                                       for m in screen.current.messages[:3]])
        ids1 = first.to_prompt_token_ids(tok)
        ids2 = second.to_prompt_token_ids(tok)
        shared = next((i for i, (a, b) in enumerate(zip(ids1, ids2)) if a != b), len(ids1))
        cached = bar.info.cached_tokens
        assert cached >= shared // block * block > 0
        assert cached % block == 0 and cached < len(ids2)
        assert bar.info.prompt_tokens == len(ids2)
        assert f"cached {cached}/{len(ids2)}" in bar.plain
        stats = app.store.get_conversation(screen.current.id).messages[-1].stats
        assert stats["usage"]["cached_tokens"] == cached
