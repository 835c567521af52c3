"""The one-line status bar: model and format, device, TTFT, decode tokens/s, cached prompt
tokens of this turn, speculative acceptance, KV cache use (a small bar) and context used vs
``max_model_len``; see ``status_info.py`` for where each number comes from.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from localchat.app.tui.status_info import StatusInfo, format_status


class StatusBar(Widget):
    """Renders ``info`` (a ``StatusInfo``) to fit its width; assign a new one to update."""

    info: reactive[StatusInfo] = reactive(StatusInfo, layout=False)

    def render(self) -> Text:
        return format_status(self.info, max(10, self.size.width))

    @property
    def plain(self) -> str:
        """The text shown (for tests and screen readers)."""
        return format_status(self.info, max(10, self.size.width)).plain
