"""localchat.themes: the TUI's Textual themes and its ``.tcss`` layout, shipped as package data.

``THEMES`` holds the three themes localchat registers (``localchat-dark``, ``localchat-light``,
``localchat-high-contrast``); ``load_css()`` reads ``localchat.tcss`` through
``importlib.resources`` (works in editable and wheel installs). The layout uses theme variables
only (``$primary``, ``$surface``, ...), so every theme, Textual's built-in ones included, styles
the same layout. Short names ``dark``, ``light`` and ``high-contrast`` are accepted by
``resolve_theme_name`` (``localchat --theme dark``).
"""

from __future__ import annotations

from importlib import resources

from textual.theme import Theme

DARK = Theme(
    name="localchat-dark",
    primary="#5fafff",
    secondary="#87d7af",
    accent="#ffaf5f",
    warning="#ffd75f",
    error="#ff5f5f",
    success="#87d787",
    foreground="#d0d0d0",
    background="#121417",
    surface="#1b1e23",
    panel="#262a31",
    dark=True,
)
LIGHT = Theme(
    name="localchat-light",
    primary="#005fd7",
    secondary="#008767",
    accent="#af5f00",
    warning="#af8700",
    error="#d70000",
    success="#008700",
    foreground="#1c1c1c",
    background="#fafafa",
    surface="#ffffff",
    panel="#e8e8e8",
    dark=False,
)
# WCAG AAA contrast: pure black and white with saturated, bright accents.
HIGH_CONTRAST = Theme(
    name="localchat-high-contrast",
    primary="#ffff00",
    secondary="#00ffff",
    accent="#ff00ff",
    warning="#ffff00",
    error="#ff3030",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#1a1a1a",
    dark=True,
    text_alpha=1.0,
    luminosity_spread=0.3,
)
THEMES: tuple[Theme, ...] = (DARK, LIGHT, HIGH_CONTRAST)
DEFAULT_THEME = DARK.name
SHORT_NAMES = {"dark": DARK.name, "light": LIGHT.name, "high-contrast": HIGH_CONTRAST.name}
CSS_FILE = "localchat.tcss"


def resolve_theme_name(name: str) -> str:
    """A theme's full name: ``dark`` -> ``localchat-dark``; other names are returned as given."""
    return SHORT_NAMES.get(name.strip().lower(), name.strip())


def load_css() -> str:
    """The TUI layout (``localchat.tcss``) as text, read as package data."""
    return resources.files(__name__).joinpath(CSS_FILE).read_text(encoding="utf-8")
