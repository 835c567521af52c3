"""Textual messages the TUI's widgets post, as dataclasses.

Each is a ``textual.message.Message`` whose fields are declared with ``@dataclass`` (Textual
initialises its own fields in ``Message.__post_init__``, which the dataclass ``__init__`` calls).
Handlers follow Textual's naming: ``on_prompt_submitted``, ``on_conversation_selected``, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass(eq=False)
class PromptSubmitted(Message):
    """The user pressed Enter in the prompt: ``text`` is what they typed (stripped)."""

    text: str


@dataclass(eq=False)
class ConversationSelected(Message):
    """A conversation was picked in the sidebar (by id), or a search hit was opened."""

    conversation_id: str


@dataclass(eq=False)
class EngineLoaded(Message):
    """The engine thread finished loading ``model``: ``engine`` is set, or ``error`` (one line)
    says why not. ``preloaded``: the engine was passed in, not loaded here."""

    model: str
    engine: Any = None
    error: str | None = None
    preloaded: bool = False


@dataclass(eq=False)
class PullProgress(Message):
    """A line of download progress while fetching ``model`` (from the hub's progress callback)."""

    model: str
    line: str
