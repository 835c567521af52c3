"""The message input: a multi-line ``TextArea`` where Enter sends and Ctrl+J inserts a newline
(Alt+Enter and Shift+Enter too where the terminal reports them, e.g. with the kitty keyboard
protocol; tmux and many terminals send them as a plain Enter).
"""

from __future__ import annotations

from textual import events
from textual.widgets import TextArea

from localchat.app.tui.messages import PromptSubmitted

NEWLINE_KEYS = ("ctrl+j", "alt+enter", "shift+enter")


class PromptInput(TextArea):
    """Posts ``PromptSubmitted(text)`` on Enter (non-blank text only); the receiver clears the
    input once it accepts the message, so a refused message stays as typed."""

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
                self.post_message(PromptSubmitted(text))
            return
        await super()._on_key(event)
