"""Stored conversations as text: Markdown and JSON exports, timestamps for people.

Pure functions over ``store.Conversation``; used by ``Store.export_*``, ``localchat history``
and the TUI's export.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

EXPORT_FORMAT_VERSION = 1


def iso_time(seconds: float) -> str:
    """Unix seconds as ISO 8601 UTC to the second, e.g. ``2026-11-29T12:30:05Z``."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def local_time(seconds: float) -> str:
    """Unix seconds as local ``YYYY-MM-DD HH:MM`` (for listings)."""
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def to_dict(conv: Any) -> dict[str, Any]:
    """A conversation with its messages as plain JSON-able data (times in ISO 8601 UTC)."""
    data = asdict(conv)
    data.pop("message_count", None)
    data["format_version"] = EXPORT_FORMAT_VERSION
    for key in ("created", "updated"):
        data[key] = iso_time(data[key])
    for msg in data["messages"]:
        msg.pop("conversation_id", None)
        msg["created"] = iso_time(msg["created"])
    return data


def to_json(conv: Any) -> str:
    """``to_dict`` as indented JSON text (non-ASCII kept as is), ending with a newline."""
    return json.dumps(to_dict(conv), indent=2, ensure_ascii=False) + "\n"


def to_markdown(conv: Any) -> str:
    """The conversation as Markdown: ``# title``, a metadata list, then ``## User`` /
    ``## Assistant`` sections in order; an interrupted reply is marked ``(interrupted)``."""
    lines = [f"# {conv.title or 'Untitled conversation'}", ""]
    lines.append(f"- id: `{conv.id}`")
    if conv.model:
        lines.append(f"- model: `{conv.model}`")
    lines.append(f"- created: {iso_time(conv.created)}")
    if conv.sampling:
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(conv.sampling.items()))
        lines.append(f"- sampling: {knobs}")
    lines.append("")
    if conv.system_prompt:
        lines += ["## System", "", conv.system_prompt.rstrip(), ""]
    for msg in conv.messages:
        head = f"## {msg.role.capitalize()}"
        if msg.interrupted:
            head += " (interrupted)"
        lines += [head, "", msg.content.rstrip(), ""]
    return "\n".join(lines).rstrip("\n") + "\n"
