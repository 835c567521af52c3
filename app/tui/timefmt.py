"""How the TUI writes a message's or a conversation's time: ``10:21`` today, ``Nov 30 10:21``
this year, ``2025-11-30`` before (local time)."""

from __future__ import annotations

import time


def when(ts: float, *, now: float | None = None) -> str:
    """A short local time for Unix time ``ts`` (seconds), relative to ``now`` (default: now)."""
    t, n = time.localtime(ts), time.localtime(time.time() if now is None else now)
    if t[:3] == n[:3]:
        return time.strftime("%H:%M", t)
    if t.tm_year == n.tm_year:
        return time.strftime("%b %d %H:%M", t)
    return time.strftime("%Y-%m-%d", t)


def day(ts: float, *, now: float | None = None) -> str:
    """A short local date for the sidebar: ``10:21`` today, ``Nov 30`` this year, else
    ``2025-11-30``."""
    t, n = time.localtime(ts), time.localtime(time.time() if now is None else now)
    if t[:3] == n[:3]:
        return time.strftime("%H:%M", t)
    if t.tm_year == n.tm_year:
        return time.strftime("%b %d", t)
    return time.strftime("%Y-%m-%d", t)
