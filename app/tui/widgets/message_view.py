"""One chat message: a role line (who, the model for a reply, and when), the text as Markdown
(streamed while a reply arrives), and a mark when the reply was interrupted. Single newlines
are hard line breaks (as chat UIs render them; a markdown-it core rule), so "Line
one\nLine two" stays on two lines. Focusable: ``c`` copies the message, ``k`` its code
blocks one after another; a click on a code block copies that block.
"""

from __future__ import annotations

from typing import ClassVar

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import Label, Markdown
from textual.widgets._markdown import MarkdownFence, MarkdownStream

from localchat.app.render import extract_code_blocks
from localchat.app.tui.timefmt import when

INTERRUPTED_MARK = "⏹ interrupted"
ROLE_NAMES = {"user": "You", "assistant": "Assistant"}


def chat_markdown_parser() -> MarkdownIt:
    """The parser for messages: GFM-like, with a single newline as a hard line break."""
    md = MarkdownIt("gfm-like", {"breaks": True})
    md.core.ruler.push("localchat_hard_breaks", _hard_breaks)
    return md


def _hard_breaks(state: StateCore) -> None:
    """Core rule: every soft line break becomes a hard one (markdown-it's ``breaks`` option
    only changes HTML rendering; Textual reads the tokens)."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def role_line(role: str, model: str | None, created: float | None) -> str:
    """``"Assistant · smollm2-135m · 10:21"``: who, the model (replies), the time (if known)."""
    parts = [ROLE_NAMES.get(role, role)]
    if model and role == "assistant":
        parts.append(model)
    if created is not None:
        parts.append(when(created))
    return " · ".join(parts)


class MessageView(Widget, can_focus=True):
    """A message. ``text`` is the Markdown source shown so far; ``model`` the model that
    wrote a reply and ``created`` its time (Unix seconds), both shown in the role line.

    While streaming, ``append`` feeds Textual's ``MarkdownStream`` (fragments batched when the
    UI lags behind the engine); ``finish`` stops it and applies one full update so the final
    render equals a one-shot render of the whole text.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "copy_message", "Copy message"),
        Binding("k", "copy_code", "Copy code block"),
    ]

    def __init__(self, role: str, text: str = "", *, interrupted: bool = False,
                 streaming: bool = False, index: int | None = None,
                 model: str | None = None, created: float | None = None) -> None:
        super().__init__(classes=f"-{role}")
        self.role = role
        self.text = text
        self.interrupted = interrupted
        self.streaming = streaming
        self.index = index
        self.model = model
        self.created = created
        self._stream: MarkdownStream | None = None
        self._code_cursor = 0

    def compose(self) -> ComposeResult:
        yield Label(role_line(self.role, self.model, self.created), classes="role",
                    markup=False)
        yield Markdown(self.text, parser_factory=chat_markdown_parser)
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
