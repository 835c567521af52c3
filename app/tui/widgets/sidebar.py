"""The history sidebar: a search box over the shared history (FTS5) and the list of
conversations, newest first, each with its date and model. Selecting an entry (Enter or
click) posts ``ConversationSelected``; with a query typed, the list shows matching messages
instead, each snippet starting shortly before the first matched word. In the search box,
Enter opens the highlighted entry and Down moves into the list.
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, ListItem, ListView

from localchat.app.tui.messages import ConversationSelected
from localchat.app.tui.timefmt import day

LIST_LIMIT = 200
SNIPPET_LEAD = 12  # characters of context kept before the first matched word


class ConversationItem(ListItem):
    """A list row naming a conversation (``conversation_id``)."""

    def __init__(self, conversation_id: str, label: str, *, current: bool = False) -> None:
        super().__init__(Label(label, markup=False), classes="-current" if current else "")
        self.conversation_id = conversation_id


class SearchInput(Input):
    """The search box: Down moves the list's cursor (and focus) to the next entry."""

    def _on_key(self, event: events.Key) -> None:
        if event.key == "down":
            event.stop()
            event.prevent_default()
            sidebar = self.parent
            if isinstance(sidebar, Sidebar):
                sidebar.move_into_list()


def conversation_label(conv: Any) -> str:
    """The sidebar's two lines for a conversation: title, then date and model."""
    meta = " · ".join(p for p in (day(conv.updated), conv.model or "") if p)
    return f"{conv.title or 'untitled'}\n  {meta}"


class Sidebar(Vertical):
    """Reads ``self.app.store`` (a ``Store``); call ``reload`` after the history changes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.current_id: str | None = None
        self.query_text = ""

    def compose(self) -> ComposeResult:
        yield SearchInput(placeholder="Search history…", id="search")
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
            items = [ConversationItem(c.id, conversation_label(c),
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
        """Enter in the search box opens the highlighted entry (the first hit)."""
        event.stop()
        cid = self.highlighted_id()
        if cid is not None:
            self.post_message(ConversationSelected(cid))
        else:
            self.query_one(ListView).focus()

    def move_into_list(self) -> None:
        """Focus the list and move its cursor one entry down (from the search box)."""
        view = self.query_one(ListView)
        view.focus()
        if view.index is None:
            view.index = 0
        elif len(view.children) > 1:
            view.action_cursor_down()

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        cid = getattr(event.item, "conversation_id", None)
        if cid is not None:
            self.post_message(ConversationSelected(cid))


def _plain(snippet: str, lead: int = SNIPPET_LEAD) -> str:
    """A search snippet on one line, without the store's match markers, starting at most
    about ``lead`` characters before the first matched word (cut at a word boundary, marked
    with an ellipsis), so the narrow sidebar shows the match."""
    flat = " ".join(snippet.split())
    start = flat.find("\x02")
    if start > lead:
        space = flat.find(" ", start - lead, start)
        flat = "…" + flat[space + 1 if space >= 0 else start:]
    return flat.replace("\x02", "").replace("\x03", "")
