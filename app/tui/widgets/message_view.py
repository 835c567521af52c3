"""One chat message: a role line, the text as Markdown (streamed while a reply arrives), and a
mark when the reply was interrupted. Focusable: ``c`` copies the message, ``k`` its code
blocks one after another; a click on a code block copies that block.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import Label, Markdown
from textual.widgets._markdown import MarkdownFence, MarkdownStream

from localchat.app.render import extract_code_blocks

INTERRUPTED_MARK = "⏹ interrupted"
ROLE_NAMES = {"user": "You", "assistant": "Assistant"}


class MessageView(Widget, can_focus=True):
    """A message. ``text`` is the Markdown source shown so far.

    While streaming, ``append`` feeds Textual's ``MarkdownStream`` (fragments batched when the
    UI lags behind the engine); ``finish`` stops it and applies one full update so the final
    render equals a one-shot render of the whole text.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "copy_message", "Copy message"),
        Binding("k", "copy_code", "Copy code block"),
    ]

    def __init__(self, role: str, text: str = "", *, interrupted: bool = False,
                 streaming: bool = False, index: int | None = None) -> None:
        super().__init__(classes=f"-{role}")
        self.role = role
        self.text = text
        self.interrupted = interrupted
        self.streaming = streaming
        self.index = index
        self._stream: MarkdownStream | None = None
        self._code_cursor = 0

    def compose(self) -> ComposeResult:
        yield Label(ROLE_NAMES.get(self.role, self.role), classes="role")
        yield Markdown(self.text)
        yield Label(INTERRUPTED_MARK, classes="interrupted-mark")

    def on_mount(self) -> None:
        self._show_mark()

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    async def append(self, delta: str) -> None:
        """Add streamed text (Markdown source) to the end."""
        if not delta:
            return
        self.text += delta
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
        await self._stream.write(delta)

    async def finish(self, *, interrupted: bool = False) -> None:
        """The reply ended: stop streaming, render the whole text once, show the mark."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.streaming = False
        self.interrupted = interrupted
        await self.markdown.update(self.text)
        self._show_mark()

    def _show_mark(self) -> None:
        self.set_class(self.interrupted, "-interrupted")
        self.query_one(".interrupted-mark").display = self.interrupted

    # -- copying ------------------------------------------------------------------------------

    def action_copy_message(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify("Message copied to the clipboard")

    def action_copy_code(self) -> None:
        blocks = extract_code_blocks(self.text)
        if not blocks:
            self.notify("This message has no code block", severity="warning")
            return
        n = self._code_cursor % len(blocks)
        self._code_cursor += 1
        self.app.copy_to_clipboard(blocks[n])
        self.notify(f"Code block {n + 1} of {len(blocks)} copied")

    def on_click(self, event: events.Click) -> None:
        widget = event.widget
        while widget is not None and widget is not self:
            if isinstance(widget, MarkdownFence):
                self.app.copy_to_clipboard(widget.code)
                self.notify("Code block copied")
                event.stop()
                return
            widget = widget.parent
