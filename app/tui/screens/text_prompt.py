"""Small modal dialogs: ask for one line of text, or confirm an action."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class TextPromptScreen(ModalScreen[str | None]):
    """Dismisses with the text entered (Enter) or None (Esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.title_text, self.value, self.placeholder = title, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="title", markup=False)  # (user text)
            yield Input(self.value, placeholder=self.placeholder, id="value")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (the confirm button or y) or False (Esc, n)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,n", "answer(False)", "No"), Binding("y", "answer(True)", "Yes")]

    def __init__(self, question: str, confirm: str = "Delete") -> None:
        super().__init__()
        self.question, self.confirm = question, confirm

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="title", markup=False)  # (a title: "[/] ...")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="no")
                yield Button(self.confirm, id="yes", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
