"""The chat screen's history and settings actions: sidebar, new, search, rename, delete,
export to Markdown, copy, per-conversation settings, model picker, help.

A mixin for ``ChatScreen`` (what it uses of the screen is declared in
``host.ChatScreenHost``). Rename, delete and export act on the conversation under the
sidebar's cursor while the sidebar has focus, else on the one shown.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from localchat.app.history_format import to_markdown
from localchat.app.store import Conversation, Message
from localchat.app.tui.engine_host import describe_error
from localchat.app.tui.history_guard import title_for
from localchat.app.tui.screens.help_screen import HelpScreen
from localchat.app.tui.screens.host import MixinBase
from localchat.app.tui.screens.model_picker import ModelPickerScreen
from localchat.app.tui.screens.settings_screen import ConversationSettings, SettingsScreen
from localchat.app.tui.screens.text_prompt import ConfirmScreen, TextPromptScreen
from localchat.app.tui.widgets.chat_log import ChatLog
from localchat.app.tui.widgets.message_view import MessageView
from localchat.app.tui.widgets.prompt_input import PromptInput
from localchat.app.tui.widgets.sidebar import Sidebar
from localchat.engine.errors import LocalchatError


class ConversationActions(MixinBase):
    """Actions bound in ``keymap.DEFAULTS`` that manage conversations and settings."""

    # -- sidebar -----------------------------------------------------------------------------

    async def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(Sidebar)
        sidebar.toggle()
        if sidebar.open:
            await sidebar.reload(self.current.id)
            sidebar.query_one("ListView").focus()
        else:
            self.action_focus_prompt()

    async def action_search(self) -> None:
        sidebar = self.query_one(Sidebar)
        if not sidebar.open:
            sidebar.toggle()
            await sidebar.reload(self.current.id)
        sidebar.query_one("#search").focus()

    async def action_new_conversation(self) -> None:
        self.current = self.fresh_state()
        await self.render_state()
        self.refresh_status()
        self.action_focus_prompt()

    def _target_id(self) -> str | None:
        sidebar = self.query_one(Sidebar)
        if sidebar.open and sidebar.has_focus_within:
            return sidebar.highlighted_id() or self.current.id
        return self.current.id

    # -- rename / delete / export --------------------------------------------------------------

    def _stored(self, cid: str | None) -> Any:
        """The stored conversation ``cid`` (no messages), or None with a notification."""
        if cid is None:
            self.notify("This conversation is not saved yet", severity="warning")
            return None
        try:
            return self.app.store.get_conversation(cid, with_messages=False)
        except LocalchatError as exc:  # deleted meanwhile, only in memory, history failed
            self.notify(describe_error(exc), severity="warning")
            return None

    def action_rename(self) -> None:
        cid = self._target_id()
        conv = self._stored(cid)
        if conv is None:
            return

        async def done(title: str | None) -> None:
            if title is None or not title.strip():
                return
            self.app.store.rename_conversation(cid, title.strip())
            if self.current.id == cid:
                self.current.title = title.strip()
            await self.query_one(Sidebar).reload()

        self.app.push_screen(TextPromptScreen("Rename conversation", conv.title), done)

    def action_delete(self) -> None:
        cid = self._target_id()
        conv = self._stored(cid)
        if conv is None:
            return

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            running = self.states.get(cid)
            if running is not None and running.turn is not None and running.turn.worker:
                running.turn.worker.cancel()
                await running.turn.worker.wait()
            self.app.store.delete_conversation(cid)
            if self.current.id == cid:
                await self.action_new_conversation()
            await self.query_one(Sidebar).reload()
            self.notify(f"Deleted “{conv.title or 'untitled'}”")

        self.app.push_screen(
            ConfirmScreen(f"Delete “{conv.title or 'untitled'}” and its messages?"), done)

    def action_export(self) -> None:
        """Export a conversation to Markdown: from the history, or, once the history has
        failed (``HistoryGuard``), the conversation shown, from memory."""
        cid = self._target_id()
        if cid is None:
            self.notify("This conversation is not saved yet", severity="warning")
            return
        if cid == self.current.id and not self.app.store.available:
            conv = in_memory_conversation(self.current)
            text = to_markdown(conv)
        else:
            conv = self._stored(cid)
            if conv is None:
                return
            text = None
        default = f"{_slug(conv.title) or 'conversation'}-{cid.removeprefix('mem-')[:6]}.md"

        def write(target: Path) -> None:
            try:
                body = text if text is not None else self.app.store.export_markdown(cid)
                target.write_text(body, encoding="utf-8")
            except OSError as exc:
                self.notify(f"cannot write {target}: {exc.strerror}", severity="error")
                return
            self.notify(f"Exported to {target}")

        def done(path: str | None) -> None:
            if not path:
                return
            target = Path(path).expanduser()
            if target.is_dir():
                self.notify(f"{target} is a folder: give a file name", severity="error")
                return
            if not target.exists():
                write(target)
                return
            # an existing file is replaced only when the user says so (it was silently
            # overwritten)
            self.app.push_screen(
                ConfirmScreen(f"{target} exists. Replace it with this conversation?",
                              confirm="Replace"),
                lambda yes: write(target) if yes else self.notify("Not exported"))

        self.app.push_screen(TextPromptScreen("Export to Markdown file", default), done)

    # -- copy and focus ----------------------------------------------------------------------

    def _last_reply_view(self) -> MessageView | None:
        log = self.query_one(ChatLog)
        replies = [v for v in log.views() if v.role == "assistant"]
        return replies[-1] if replies else None

    def action_copy_reply(self) -> None:
        view = self._last_reply_view()
        if view is None:
            self.notify(
                "No reply to copy", severity="warning")
        else:
            view.action_copy_message()

    def action_copy_code(self) -> None:
        view = self._last_reply_view()
        if view is None:
            self.notify(
                "No reply to copy from", severity="warning")
        else:
            view.action_copy_code()

    def action_focus_prompt(self) -> None:
        self.query_one(PromptInput).focus()

    # -- settings, model, help -----------------------------------------------------------------

    def action_settings(self) -> None:
        """The conversation settings dialog. A model or draft the load would refuse keeps the
        dialog open with a notification (``ChatApp.check_load``): the model in use and the
        conversation's settings stay as they were."""
        state = self.current
        initial = ConversationSettings(state.system_prompt, state.model or self.app.model_name,
                                       self.app.draft, dict(state.sampling))

        def target(result: ConversationSettings) -> tuple[str, str | None] | None:
            """The (model, draft) to switch to, None to keep the engine (an empty model field
            keeps the model; the same values load again only when no model is loaded)."""
            wanted = (result.model or self.app.model_name, result.draft)
            if wanted == (self.app.model_name, self.app.draft) and not self.app.engine_error:
                return None
            return wanted

        def check(result: ConversationSettings) -> str | None:
            wanted = target(result)
            return None if wanted is None else self.app.check_load(*wanted)

        def done(result: ConversationSettings | None) -> None:
            if result is None:
                return
            wanted = target(result)
            state.system_prompt = result.system_prompt
            state.sampling = result.sampling
            if state.id is not None:
                self.app.store.update_conversation(
                    state.id, system_prompt=result.system_prompt or "",
                    sampling=result.sampling)
            self.show_sampling()
            if wanted is not None:
                self.switch_model(*wanted)

        self.app.push_screen(SettingsScreen(initial, self.app.sampling_defaults(), check), done)

    def action_pick_model(self) -> None:
        def done(alias: str | None) -> None:
            if alias and alias != self.app.model_name:
                self.switch_model(alias, self.app.draft)

        engine = self.app.engine
        remote = engine if getattr(engine, "remote", False) else None
        self.app.push_screen(ModelPickerScreen(self.app.model_name,
                                               getattr(self.app, "context", None),
                                               remote=remote), done)

    def switch_model(self, model: str, draft: str | None) -> bool:
        """Load another model for this and later replies (running replies are stopped); False,
        with a notification and nothing unloaded, for a model or draft the load would refuse
        (``ChatApp.check_load``). The conversation's stored model changes when the load
        succeeds (``model_loaded``): a model that failed to load was written into it, and the
        history then named it for turns another model wrote."""
        problem = self.app.check_load(model, draft)
        if problem:
            self.notify(problem, severity="error", title=f"Cannot load {model}", timeout=15)
            return False
        for state in list(self.states.values()):
            if state.turn is not None and state.turn.worker is not None:
                state.turn.worker.cancel()
        self.switched_for = (self.current, model)
        self.app.load_model(model, draft)
        self.refresh_status()
        return True

    def model_loaded(self, model: str) -> None:
        """``model`` now answers (the app's ``EngineLoaded`` without an error): where this
        screen switched to it, it becomes that conversation's model, in the history too."""
        state, wanted = self.switched_for
        if state is None or wanted != model:
            return
        self.switched_for = (None, None)
        state.model = model
        if state.id is not None:
            try:
                self.app.store.update_conversation(state.id, model=model)
            except Exception as exc:  # noqa: BLE001
                self.notify(describe_error(exc), severity="error")

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.app.keymap))


def in_memory_conversation(state: Any) -> Conversation:
    """A ``store.Conversation`` built from the screen's ``ConversationState`` (for export
    when the history cannot be read)."""
    now = time.time()
    created = next((m.created for m in state.messages if m.created is not None), now)
    messages = [Message(m.message_id, state.id or "", m.role, m.content,
                        m.created if m.created is not None else now, m.interrupted, m.stats)
                for m in state.messages]
    return Conversation(state.id or "", state.title or title_for(state.messages), state.model,
                        state.system_prompt, dict(state.sampling), created, now,
                        len(messages), messages)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]
