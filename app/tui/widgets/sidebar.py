"""The history sidebar: a search box over the shared history (FTS5) and the list of
conversations, newest first. Selecting an entry (Enter or click) posts
``ConversationSelected``; with a query typed, the list shows matching messages instead.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, ListItem, ListView

from localchat.app.tui.messages import ConversationSelected

LIST_LIMIT = 200


class ConversationItem(ListItem):
    """A list row naming a conversation (``conversation_id``)."""

    def __init__(self, conversation_id: str, label: str, *, current: bool = False) -> None:
        super().__init__(Label(label, markup=False), classes="-current" if current else "")
        self.conversation_id = conversation_id


class Sidebar(Vertical):
    """Reads ``self.app.store`` (a ``Store``); call ``reload`` after the history changes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.current_id: str | None = None
        self.query_text = ""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search history…", id="search")
        yield ListView(id="conversations")
        yield Label("Enter open · F2 rename · F8 delete · Ctrl+T export",
                    classes="sidebar-hint")

    @property
    def open(self) -> bool:
        return self.has_class("-open")

    def toggle(self) -> None:
        self.set_class(not self.open, "-open")

    async def reload(self, current_id: str | None = None) -> None:
        """Rebuild the list: conversations, or search hits while a query is typed."""
        if current_id is not None:
            self.current_id = current_id
        items: list[ListItem]
        store = self.app.store
        if self.query_text.strip():
            hits = store.search(self.query_text)
            items = [ConversationItem(h.conversation_id,
                                      f"{h.title or 'untitled'}\n  {_plain(h.snippet)}")
                     for h in hits]
            if not items:
                items = [ListItem(Label("no match", classes="sidebar-hint"))]
        else:
            items = [ConversationItem(c.id, c.title or "untitled",
                                      current=c.id == self.current_id)
                     for c in store.list_conversations(limit=LIST_LIMIT)]
        view = self.query_one(ListView)
        await view.clear()
        await view.extend(items)
        current = [i for i, item in enumerate(items)
                   if getattr(item, "conversation_id", None) == self.current_id]
        view.index = current[0] if current and not self.query_text.strip() else 0

    def highlighted_id(self) -> str | None:
        """The conversation under the list cursor, or None."""
        item = self.query_one(ListView).highlighted_child
        return getattr(item, "conversation_id", None)

    async def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.query_text = event.value
        await self.reload()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(ListView).focus()

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        cid = getattr(event.item, "conversation_id", None)
        if cid is not None:
            self.post_message(ConversationSelected(cid))


def _plain(snippet: str) -> str:
    """A search snippet without the store's match markers, on one line."""
    return " ".join(snippet.replace("\x02", "").replace("\x03", "").split())
