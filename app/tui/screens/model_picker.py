"""The model picker: the catalog with each model's cache state, the memory plan of the
highlighted cached model (weights format and bytes, from ``engine/memory/planner.py``), and a
pull with progress for models not cached yet. Dismisses with the chosen alias or None.

When the chat runs against a server (``--endpoint`` or a running ``localchat serve``: the
engine is an ``AsyncRemoteEngine``), the picker lists that server's ``GET /v1/models`` instead
(id, context when reported, owner); picking one switches the chat to that model on the same
server. Nothing is pulled or planned locally then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, ProgressBar, Static

from localchat.app.tui.engine_host import describe_error, plan_for


@dataclass(frozen=True)
class RemoteModel:
    """A row of a server's ``/v1/models``: ``alias`` is the model id (``cached``: always
    usable), ``max_model_len`` in tokens when the server reports it."""

    alias: str
    max_model_len: int | None = None
    owned_by: str | None = None
    cached: bool = True


class ModelPickerScreen(ModalScreen[str | None]):
    """Enter picks the highlighted model (pulling it first when not cached); Esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"), Binding("p", "pull", "Pull")]

    def __init__(self, current: str | None = None, context: int | None = None,
                 remote: Any = None) -> None:
        super().__init__()
        self.current = current
        self.context = context  # the session's --context / config value (None: default)
        self.remote = remote  # an AsyncRemoteEngine: list its server's models instead
        self.rows: list = []
        self.pulling = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Models (Enter: use, p: pull, Esc: cancel)", classes="title")
            yield DataTable(cursor_type="row", id="models")
            yield Static("", id="plan")
            bar = ProgressBar(total=None, show_eta=False, id="pull-progress")
            bar.display = False
            yield bar

    def on_mount(self) -> None:
        if self.remote is not None:
            self.query_one(".title", Label).update(
                f"Models at {self.remote.base_url} (Enter: use, Esc: cancel)")
            self.load_remote_rows()
        else:
            self.load_rows()

    @work(exclusive=True, group="list")
    async def load_remote_rows(self) -> None:
        try:
            cards = await self.remote.list_models()
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            self.notify(describe_error(exc), severity="error")
            return
        self.rows = [RemoteModel(str(c["id"]), c.get("max_model_len"), c.get("owned_by"))
                     for c in cards]
        table = self.query_one(DataTable)
        table.add_columns("model", "context", "owned by")
        for info in self.rows:
            current = " (current)" if info.alias == self.current else ""
            context = "-" if not info.max_model_len else f"{info.max_model_len:,} tokens"
            table.add_row(info.alias + current, context, info.owned_by or "-", key=info.alias)
        if not self.rows:
            self.query_one("#plan", Static).update(
                f"{self.remote.base_url}/models lists no model")

    @work(thread=True, exclusive=True, group="list")
    def load_rows(self) -> None:
        from localchat.app.settings import cache_dir
        from localchat.engine.hub.resolve import list_models

        try:
            rows = list_models(cache_dir())
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            self.app.call_from_thread(self.notify, describe_error(exc), severity="error")
            return
        self.app.call_from_thread(self._fill, rows)

    def _fill(self, rows: list) -> None:
        self.rows = rows
        table = self.query_one(DataTable)
        table.add_columns("alias", "cached", "size", "description")
        for info in rows:
            size = "-" if info.size_bytes is None else f"{info.size_bytes / 2**20:,.0f} MiB"
            mark = "✓" if info.cached else "-"
            current = " (current)" if info.alias == self.current else ""
            table.add_row(info.alias + current, mark, size, info.description, key=info.alias)

    def _highlighted(self):
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None:
            return None
        return self.rows[table.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        info = self._highlighted()
        if info is None:
            return
        if self.remote is not None:
            self.query_one("#plan", Static).update(
                f"{info.alias}: served by {self.remote.base_url}")
            return
        if info.cached and info.path is not None:
            self.query_one("#plan", Static).update("planning memory…")
            self.show_plan(info.alias, info.path)
        else:
            self.query_one("#plan", Static).update(
                f"{info.alias} is not cached: {info.source}. Press p (or Enter) to pull it.")

    @work(thread=True, exclusive=True, group="plan")
    def show_plan(self, alias: str, path) -> None:
        text = (plan_for(path, self.context)
                or "memory plan unavailable (no planner in this build)")
        self.app.call_from_thread(self.query_one("#plan", Static).update,
                                  f"{alias}: {text}")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        info = self._highlighted()
        if info is None:
            return
        if info.cached:
            self.dismiss(info.alias)
        else:
            self.action_pull()

    def action_pull(self) -> None:
        info = self._highlighted()
        if info is None or self.pulling:
            return
        if self.remote is not None:
            self.notify("the server's models are not pulled here; Enter uses one")
            return
        self.pulling = True
        self.query_one(ProgressBar).display = True
        self.pull(info.alias)

    @work(thread=True, exclusive=True, group="pull")
    def pull(self, alias: str) -> None:
        from localchat.app.settings import cache_dir
        from localchat.engine.hub.resolve import resolve_model

        def progress(line: str) -> None:
            self.app.call_from_thread(self.query_one("#plan", Static).update,
                                      " ".join(line.split()))

        try:
            resolve_model(alias, cache_dir=cache_dir(), download=True, progress=progress)
        except Exception as exc:  # noqa: BLE001 - a notification, never a traceback
            self.app.call_from_thread(self._pulled, alias, describe_error(exc))
            return
        self.app.call_from_thread(self._pulled, alias, None)

    def _pulled(self, alias: str, error: str | None) -> None:
        self.pulling = False
        self.query_one(ProgressBar).display = False
        if error:
            self.notify(error, severity="error", title=f"Pull {alias} failed")
            return
        self.notify(f"{alias} is in the cache")
        self.dismiss(alias)

    def action_cancel(self) -> None:
        self.dismiss(None)
