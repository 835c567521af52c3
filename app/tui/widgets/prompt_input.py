"""The message input: a multi-line ``TextArea`` where Enter sends and Ctrl+J / Alt+Enter
insert a newline (the convention of chat apps; Shift+Enter too where the terminal reports it).
"""

from __future__ import annotations

from textual import events
from textual.widgets import TextArea

from localchat.app.tui.messages import PromptSubmitted

NEWLINE_KEYS = ("ctrl+j", "alt+enter", "shift+enter")


class PromptInput(TextArea):
    """Posts ``PromptSubmitted(text)`` on Enter (non-blank text only) and clears itself."""

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         compact=True, highlight_cursor_line=False, **kwargs)
        self.placeholder = "Message (Enter sends, Ctrl+J newline, F1 help)"

    async def _on_key(self, event: events.Key) -> None:
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.clear()
                self.post_message(PromptSubmitted(text))
            return
        await super()._on_key(event)
