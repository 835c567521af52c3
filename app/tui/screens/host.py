"""What the ``ChatScreen`` mixins (``TurnRunner``, ``ConversationActions``) need from it.

``ChatScreenHost`` declares the screen's state and helpers that the mixins call, on top of
Textual's ``Screen`` API (``query_one``, ``notify``, ``run_worker``, ``app``). The mixins
inherit it only while type checking (``MixinBase``); at run time they inherit ``object``, so
``ChatScreen``'s method resolution order is unchanged and ``Screen`` stays the real base.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.screen import Screen

    from localchat.app.tui.state import ConversationState
    from localchat.app.tui.status_info import StatusInfo
    from localchat.app.tui.widgets.message_view import MessageView

    class ChatScreenHost(Screen[Any]):
        """The part of ``ChatScreen`` its mixins use (declarations only)."""

        app: Any
        current: ConversationState
        states: dict[str, ConversationState]
        info: StatusInfo
        _live: dict[str, MessageView]
        switched_for: tuple[ConversationState | None, str | None]

        def fresh_state(self) -> ConversationState: ...
        async def render_state(self) -> None: ...
        def refresh_status(self) -> None: ...
        def set_status(self, info: StatusInfo) -> None: ...
        def show_notice(self, text: str) -> None: ...
        def action_focus_prompt(self) -> None: ...

    MixinBase = ChatScreenHost
else:
    MixinBase = object
