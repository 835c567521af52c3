"""Streaming one reply: the chat screen's turn runner.

A mixin for ``ChatScreen`` (what it uses of the screen is declared in
``host.ChatScreenHost``). ``start_turn`` renders the
conversation into prompt ids that fit the context and starts a worker that streams
``engine.generate`` into the reply's ``MessageView`` (when that conversation is on screen) and
into the status bar; ``_end_turn`` saves the reply (marked interrupted after a stop, an abort
or an engine error) and renders it once in full. Cancelling the worker closes the stream,
which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from localchat.app.report import answer_stats
from localchat.app.session import fit_prompt
from localchat.app.tui.engine_host import describe_error
from localchat.app.tui.screens.host import MixinBase
from localchat.app.tui.state import ChatMessage, ConversationState, Turn, new_request_id
from localchat.app.tui.status_info import with_output
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.message_view import MessageView
from localchat.app.tui.widgets.sidebar import Sidebar


def dropped_notice(n: int) -> str:
    """The notice shown when ``n`` earlier turns were left out of the prompt."""
    turns = "turn" if n == 1 else "turns"
    return f"{n} earlier {turns} left out of the prompt to fit the context"


class TurnRunner(MixinBase):
    """``start_turn`` / ``_stream`` / ``_end_turn`` for ``ChatScreen``."""

    async def start_turn(self, state: ConversationState) -> None:
        """Render the prompt and start streaming the reply for ``state``."""
        app: Any = self.app
        engine = app.engine
        from localchat.engine.sampling_params import SamplingParams

        try:
            sampling = SamplingParams(**{**app.sampling_defaults(), **state.sampling})
            session = state.session()
            if getattr(engine, "remote", False):  # the server renders the messages
                ids, notes = session.to_messages(), []
            else:
                ids, notes = fit_prompt(session, engine.tokenizer, engine.max_model_len,
                                        sampling.max_tokens)
        except Exception as exc:  # noqa: BLE001 - bad settings, prompt too long
            self.notify(describe_error(exc), severity="error", title="Cannot send")
            return
        for note in notes:
            self.notify(note, title="Note")
        assert state.id is not None
        turn = Turn(state.id, new_request_id(state.id), len(ids),
                    session.last_dropped_turns, model=app.model_name, created=time.time())
        state.turn = turn
        self.states[state.id] = state
        self.show_notice(dropped_notice(turn.dropped_turns) if turn.dropped_turns else "")
        view = MessageView("assistant", streaming=True, model=turn.model,
                           created=turn.created)
        await self.query_one(ChatLog).add(view)
        self._live[turn.request_id] = view
        if state is self.current:
            self.refresh_status()
        turn.worker = self.run_worker(self._stream(state, turn, ids, sampling),
                                      group="turns", exit_on_error=False)

    async def _stream(self, state: ConversationState, turn: Turn, ids: list[int],
                      sampling: Any) -> None:
        engine: Any = self.app.engine
        error: str | None = None
        outputs = None
        try:
            outputs = engine.generate(ids, sampling, request_id=turn.request_id)
            async for out in outputs:
                turn.last = out
                turn.text += out.text_delta
                view = self._live.get(turn.request_id)
                if view is not None:
                    await view.append(out.text_delta)
                if state is self.current:
                    self.set_status(with_output(self.info, out))
                if out.finished:
                    reason = getattr(out.finish_reason, "value", out.finish_reason)
                    turn.interrupted = reason == "abort"
                    break
        except asyncio.CancelledError:
            turn.interrupted = True
        except Exception as exc:  # noqa: BLE001 - engine errors become a notification
            turn.interrupted = True
            error = describe_error(exc)
        finally:
            if outputs is not None:
                with contextlib.suppress(Exception):  # the request is gone either way
                    await outputs.aclose()
            await self._end_turn(state, turn, error)

    async def _end_turn(self, state: ConversationState, turn: Turn, error: str | None) -> None:
        app: Any = self.app
        turn.done = True
        view = self._live.pop(turn.request_id, None)
        stats = answer_stats(turn.last, turn.num_prompt_tokens, turn.interrupted)
        stats["model"] = turn.model  # a chat may switch models: each reply names its own
        if turn.last is None and not turn.text:  # failed before any token: nothing to keep
            state.turn = None
            if view is not None:
                await view.remove()
        else:
            row = app.store.add_message(turn.conversation_id, "assistant", turn.text,
                                        interrupted=turn.interrupted, stats=stats)
            state.messages.append(ChatMessage("assistant", turn.text, turn.interrupted, stats,
                                              row.id, row.created, turn.model))
            state.turn = None
            if view is not None and view.is_mounted:
                view.index = len(state.messages) - 1
                await view.finish(interrupted=turn.interrupted)
        self.states.pop(turn.conversation_id, None)
        if error:
            self.notify(error, severity="error", title="Reply failed", timeout=10)
        if state is self.current:
            self.refresh_status()
        sidebar = self.query_one(Sidebar)
        if sidebar.open:
            await sidebar.reload()
