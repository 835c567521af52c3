"""The chat screen: history sidebar, message list, prompt and live status bar.

One chat turn (README, Architecture): the user's message is committed to the history before
generation starts, the conversation is rendered into prompt token ids (old turns dropped to fit
the context, with a notice), and a worker streams ``AsyncLLMEngine.generate`` into a
``MessageView``. The engine runs on its own thread, so the UI stays responsive; a reply keeps
streaming into its own conversation while the user opens another one. Esc / Ctrl+C cancels the
worker, which aborts the request; the partial reply is kept and saved marked interrupted.
Text left unsent in the prompt at a quit comes back in it at the next start, in its
conversation (``unsent.py``).
Streaming lives in ``TurnRunner``; history actions (rename, delete, export, settings, model,
copy) in ``ConversationActions``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static, TextArea

from localchat.app.tui import keymap
from localchat.app.tui.engine_host import describe_error
from localchat.app.tui.messages import ConversationSelected, PromptSubmitted
from localchat.app.tui.screens.conversation_actions import ConversationActions
from localchat.app.tui.screens.turn_runner import TurnRunner, dropped_notice
from localchat.app.tui.state import (
    ChatMessage,
    ConversationState,
)
from localchat.app.tui.status_info import (
    StatusInfo,
    engine_fields,
    for_conversation,
    sampling_summary,
    with_stats,
)
from localchat.app.tui.unsent import Unsent, load_unsent, save_unsent
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.message_view import MessageView
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.sidebar import Sidebar
from localchat.app.tui.widgets.status_bar import StatusBar

STATS_INTERVAL_S = 0.5


class ChatScreen(TurnRunner, ConversationActions, Screen):
    """The main screen. ``current`` is the conversation shown; ``states`` keeps every
    conversation with a reply still streaming (by id)."""

    BINDINGS = keymap.bindings()

    def __init__(self) -> None:
        super().__init__()
        self.current = self.fresh_state()
        self.states: dict[str, ConversationState] = {}
        self.info = StatusInfo()
        self.editing: int | None = None  # index of the user message being edited
        self.draft_before_edit = ""  # the unsent prompt text Ctrl+E replaced (given back)
        self._live: dict[str, MessageView] = {}  # request_id -> view shown for it
        # (conversation, model) of a switch whose load is in flight (``model_loaded``)
        self.switched_for: tuple[ConversationState | None, str | None] = (None, None)
        self.prompt_text = ""  # the prompt's text, followed as it changes (kept at a quit)
        self.restored_unsent: Unsent | None = None  # what restore_unsent gave back, if any

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar")
            with Vertical(id="chat-pane"):
                yield Static("", id="history-banner", markup=False)
                yield Static("", id="notice")
                yield ChatLog(id="chat-log")
                yield PromptInput(id="prompt")
        yield StatusBar()
        yield Footer()

    async def on_mount(self) -> None:
        await self.query_one(ChatLog).show([])
        self.query_one(PromptInput).focus()
        self.set_interval(STATS_INTERVAL_S, self.poll_stats)
        self.refresh_status()
        problem = getattr(self.app.store, "problem", None)
        if problem:
            self.show_history_banner(problem)
        await self.restore_unsent(load_unsent())

    async def restore_unsent(self, unsent: Unsent | None) -> None:
        """Put the text the last quit left unsent back in the prompt, in the conversation it
        was typed in when that one is still in the history (else in a new one)."""
        if unsent is None:
            return
        self.restored_unsent = unsent
        app: Any = self.app
        if unsent.conversation_id is not None and _stored(app.store, unsent.conversation_id):
            await self.open_conversation(unsent.conversation_id)
        prompt = self.query_one(PromptInput)
        prompt.text = unsent.text
        prompt.move_cursor(prompt.document.end)
        self.notify("Your unsent message is back in the prompt", timeout=4)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if isinstance(event.text_area, PromptInput):
            self.prompt_text = event.text_area.text

    def on_unmount(self) -> None:
        """Keep what the prompt holds unsent (``unsent.py``). A quit during an edit (Ctrl+E)
        ends it as Esc does: the draft set aside is what is kept, and the rewrite too where
        it differs from the message it edits (an untouched one was sent already). An empty
        prompt removes the kept text only when it is the text this screen restored (another
        TUI's quit may have kept its own since)."""
        text = self.prompt_text
        if self.editing is not None:
            edited = self.current.messages[self.editing].content \
                if self.editing < len(self.current.messages) else ""
            kept = [t for t in (self.draft_before_edit, "" if text == edited else text)
                    if t.strip()]
            text = "\n\n".join(kept)
        if text.strip():
            save_unsent(Unsent(text, self.current.id))
        elif self.restored_unsent is not None and load_unsent() == self.restored_unsent:
            save_unsent(None)  # what this screen gave back was sent or cleared

    # -- state helpers ---------------------------------------------------------------------

    def fresh_state(self) -> ConversationState:
        app: Any = self.app
        return ConversationState(model=None, system_prompt=app.default_system,
                                 sampling={})

    def set_status(self, info: StatusInfo) -> None:
        self.info = info
        self.query_one(StatusBar).info = info

    def show_sampling(self) -> None:
        """The sampling the next reply uses, under the prompt box."""
        app: Any = self.app
        summary = sampling_summary({**app.sampling_defaults(), **self.current.sampling})
        self.query_one(PromptInput).border_subtitle = summary

    def refresh_status(self) -> None:
        """Status from the app's engine state (after a load, a switch, or a failure)."""
        app: Any = self.app
        self.show_sampling()
        if app.engine is None:
            state = "error" if app.engine_error else "loading"
            self.set_status(replace(self.info, state=state, model=app.model_name,
                                    weight_format=None, device=None, kv_usage=None))
            return
        fields = engine_fields(app.engine.get_info(), app.model_name)
        state = "streaming" if self.current.streaming else "ready"
        self.set_status(replace(self.info, state=state, **fields))
        self.poll_stats()

    def poll_stats(self) -> None:
        engine = getattr(self.app, "engine", None)
        if engine is None:
            return
        try:
            stats = engine.get_stats()
        except Exception:  # noqa: BLE001 - a dead engine shows up on the next turn
            return
        self.set_status(with_stats(self.info, stats))

    def show_notice(self, text: str) -> None:
        notice = self.query_one("#notice", Static)
        notice.update(text)
        notice.set_class(bool(text), "-visible")

    def show_history_banner(self, problem: str) -> None:
        """The persistent banner shown once the history file failed (``HistoryGuard``)."""
        banner = self.query_one("#history-banner", Static)
        banner.update(f"⚠ Not saving: {problem}. This chat is kept in memory only: Ctrl+T "
                      "exports it. To fix, quit and run 'localchat history repair' (or "
                      "move that file aside: a new one is created).")
        banner.add_class("-visible")

    async def render_state(self) -> None:
        """Show ``current`` in the message list (re-attaching a streaming reply)."""
        state = self.current
        self._live.clear()
        views = [MessageView(m.role, m.content, interrupted=m.interrupted, index=i,
                             model=m.model, created=m.created)
                 for i, m in enumerate(state.messages)]
        turn = state.turn if state.streaming else None
        live = MessageView("assistant", turn.text, streaming=True, model=turn.model,
                           created=turn.created) if turn else None
        await self.query_one(ChatLog).show(views + ([live] if live else []))
        if turn is not None and live is not None:
            self._live[turn.request_id] = live
            await live.append(turn.text[len(live.text):])  # deltas that came meanwhile
        self.editing = None
        if turn is None:  # a streaming turn updates the figures itself
            self.set_status(for_conversation(self.info, state.messages))
        dropped = turn.dropped_turns if turn else 0
        self.show_notice(dropped_notice(dropped) if dropped else "")
        sidebar = self.query_one(Sidebar)
        sidebar.current_id = state.id
        if sidebar.open:
            await sidebar.reload()

    # -- sending -----------------------------------------------------------------------------

    async def on_prompt_submitted(self, message: PromptSubmitted) -> None:
        await self.send(message.text)

    async def send(self, text: str) -> bool:
        """Commit ``text`` as the user's message, clear the prompt and start the reply; False
        (with a notification, the prompt left as typed) when that cannot happen now."""
        app: Any = self.app
        state = self.current
        problem = None
        if app.engine is None:
            problem = ("the model is still loading" if not app.engine_error
                       else "no model is loaded (Ctrl+O picks one)")
        elif state.streaming:
            problem = "a reply is still streaming (Esc stops it)"
        if problem:
            self.notify(problem, severity="warning")
            return False
        too_long = self.too_long(state, text)
        if too_long:  # refused before it is saved: the text stays in the prompt
            self.notify(too_long, severity="error", title="Cannot send")
            return False
        prompt = self.query_one(PromptInput)
        prompt.clear()
        if self.editing is not None:
            await self.truncate(state, self.editing)
            self.editing = None
            prompt.text, self.draft_before_edit = self.draft_before_edit, ""
        conv_id = self.ensure_saved(state)
        row = app.store.add_message(conv_id, "user", text)  # committed before generating
        state.messages.append(ChatMessage("user", text, message_id=row.id,
                                          created=row.created))
        await self.query_one(ChatLog).add(
            MessageView("user", text, index=len(state.messages) - 1, created=row.created))
        await self.start_turn(state)
        return True

    def too_long(self, state: ConversationState, text: str) -> str | None:
        """Why ``text`` cannot be sent in ``state`` at all (the system prompt and it alone
        leave no room for a reply in the local engine's context: ``session.fit_prompt``), or
        None. Checked before the message is saved, so that such a message neither joins the
        history nor pushes the earlier turns out of every later prompt."""
        app: Any = self.app
        if getattr(app.engine, "remote", False):  # (the server judges its own context)
            return None
        from localchat.app.session import ChatSession, fit_prompt
        from localchat.engine.errors import ContextLengthError

        session = ChatSession(system=state.system_prompt or None)
        session.add_user(text)
        max_tokens = {**app.sampling_defaults(), **state.sampling}.get("max_tokens")
        try:
            fit_prompt(session, app.engine.tokenizer, app.engine.max_model_len, max_tokens)
        except ContextLengthError as exc:
            return str(exc)
        return None

    def ensure_saved(self, state: ConversationState) -> str:
        """The conversation's id, creating its history row on first use."""
        app: Any = self.app
        if state.id is None:
            conv = app.store.create_conversation(state.model or app.model_name,
                                                 state.system_prompt, state.sampling)
            state.id = conv.id
            self.query_one(Sidebar).current_id = conv.id
        return state.id

    # -- actions -----------------------------------------------------------------------------

    def action_stop(self) -> None:
        """Stop the reply streaming in this conversation (partial text kept)."""
        turn = self.current.turn
        if self.current.streaming and turn is not None and turn.worker is not None:
            turn.worker.cancel()
            return
        focused = self.app.focused
        if isinstance(focused, TextArea) and focused.selected_text:
            self.app.copy_to_clipboard(focused.selected_text)
            return
        if self.editing is not None:  # cancel the edit: the earlier draft comes back
            self.editing = None
            self.query_one(PromptInput).text, self.draft_before_edit = self.draft_before_edit, ""
            self.show_notice("")
            return
        self.notify("Nothing to stop (Ctrl+Q quits)", timeout=2)

    async def action_regenerate(self) -> None:
        """Replace the last reply with a new one (or answer a last message left without a
        reply, after an error)."""
        state = self.current
        if state.streaming or not state.messages:
            self.notify("Nothing to regenerate" if not state.streaming
                        else "a reply is still streaming (Esc stops it)", severity="warning")
            return
        if self.app.engine is None:
            self.notify("no model is loaded", severity="warning")
            return
        if state.messages[-1].role == "assistant":
            await self.truncate(state, len(state.messages) - 1)
        await self.start_turn(state)

    def action_edit_last(self) -> None:
        """Put the last user message in the prompt; Enter resends it (later turns replaced).
        An unsent draft is kept aside and put back when the edit is sent or cancelled."""
        state = self.current
        idx = state.last_index("user")
        if state.streaming or idx is None:
            self.notify("Nothing to edit" if not state.streaming
                        else "a reply is still streaming (Esc stops it)", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        if self.editing is not None:  # a second Ctrl+E would throw the rewrite away
            prompt.focus()
            self.show_notice("Already editing your last message: Enter resends it, Esc cancels")
            return
        # what was typed but not sent (Esc or Enter gives it back)
        self.draft_before_edit = prompt.text
        self.editing = idx
        prompt.text = state.messages[idx].content
        prompt.move_cursor(prompt.document.end)  # typing goes on at the end, as in a shell
        prompt.focus()
        self.show_notice("Editing your last message: Enter resends it, Esc cancels")

    async def truncate(self, state: ConversationState, index: int) -> None:
        """Drop ``state.messages[index:]`` from the state, the history and the view."""
        app: Any = self.app
        first = state.messages[index]
        if state.id is not None and first.message_id is not None:
            app.store.delete_messages_from(state.id, first.message_id)
        del state.messages[index:]
        if state is self.current:
            for view in self.query_one(ChatLog).views():
                if view.index is not None and view.index >= index:
                    await view.remove()

    async def on_conversation_selected(self, message: ConversationSelected) -> None:
        await self.open_conversation(message.conversation_id)

    async def open_conversation(self, conversation_id: str) -> None:
        """Show a stored conversation (or one still streaming) in the message list."""
        app: Any = self.app
        if conversation_id in self.states:
            self.current = self.states[conversation_id]
        else:
            try:
                conv = app.store.get_conversation(conversation_id)
            except Exception as exc:  # noqa: BLE001 - deleted meanwhile, bad id
                self.notify(describe_error(exc), severity="error")
                return
            self.current = ConversationState.from_stored(conv)
        await self.render_state()
        self.refresh_status()
        model = self.current.model
        if model and model != app.model_name:
            self.notify(f"this conversation used {model}; replies now come from "
                        f"{app.model_name} (Ctrl+O switches)", timeout=4)


def _stored(store: Any, conversation_id: str) -> bool:
    """Whether ``conversation_id`` is in the history (deleted since, or kept only in memory
    by a history that failed: not)."""
    try:
        store.get_conversation(conversation_id, with_messages=False)
    except Exception:  # noqa: BLE001 - any failure: not there to open
        return False
    return True
