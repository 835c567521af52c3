"""The help screen: every key binding in effect (after the config's ``[keys]`` remapping).

The config name (what ``[keys]`` takes) is the first column, so a narrow terminal cuts the
descriptions, never the names; the dialog is wider than the other dialogs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from localchat.app.tui.keymap import PROMPT_KEYS, effective_keys


class HelpScreen(ModalScreen[None]):
    """Lists the bindings; Esc, q or F1 closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,f1", "dismiss", "Close")]

    def __init__(self, keymap: Mapping[str, str]) -> None:
        super().__init__()
        self.keymap = dict(keymap)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help-dialog"):
            yield Label("Keys (remap them in config.toml under [keys])", classes="title",
                        markup=False)
            table: DataTable = DataTable(cursor_type="row", zebra_stripes=True)
            table.add_columns("config name", "keys", "action")
            for name, keys, desc in effective_keys(self.keymap):
                table.add_row(name, keys, desc)
            for keys, desc in PROMPT_KEYS:
                table.add_row("-", keys, desc)
            table.add_row("-", "c / k", "Focused message: copy it / its code")
            table.add_row("-", "ctrl+p", "Command palette (themes, …)")
            yield table
            yield Label("Esc closes", classes="field-label")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
