"""The scrolling list of messages. Anchored to the bottom: it follows a streaming reply while
the user is at the bottom and stays put once they scroll up (Textual's ``anchor``), until they
scroll back down.
"""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from localchat.app.tui.widgets.message_view import MessageView

WELCOME = (
    "[b]localchat[/b]: chat with a model running on this machine.\n\n"
    "Type a message and press [b]Enter[/b] (Ctrl+J for a newline). "
    "[b]Esc[/b] stops a reply, [b]Ctrl+B[/b] shows your history, [b]Ctrl+S[/b] sets the "
    "system prompt and sampling, [b]Ctrl+O[/b] picks a model, [b]F1[/b] lists every key, "
    "[b]Ctrl+P[/b] opens the command palette (themes), [b]Ctrl+Q[/b] quits.\n\n"
    "The status bar shows time to first token, tokens/s, prompt tokens reused from the cache, "
    "KV cache use and context used, live."
)


class ChatLog(VerticalScroll):
    """Holds ``MessageView``s, or a welcome text when the conversation is empty."""

    def on_mount(self) -> None:
        self.anchor()

    async def show(self, views: list[MessageView]) -> None:
        """Replace the content with ``views`` (or the welcome text) and scroll to the end."""
        await self.remove_children()
        if views:
            await self.mount_all(views)
        else:
            await self.mount(Static(WELCOME, id="welcome"))
        self.anchor()

    async def add(self, view: MessageView) -> None:
        """Append a message (removing the welcome text)."""
        for welcome in self.query("#welcome"):
            await welcome.remove()
        await self.mount(view)

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))
