"""The TUI's key bindings: defaults with stable ids, remappable from the config file.

Every binding has an id (``localchat.<name>``). The config file's ``[keys]`` table maps a name
to a comma-separated key list (``stop = "escape,ctrl+c"``); ``keymap_from_config`` turns it
into Textual's ``Keymap`` (``App.set_keymap``), so the help screen and the footer show the
keys in effect. Key names follow Textual (``ctrl+j``, ``alt+enter``, ``f1``).
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.binding import Binding

PREFIX = "localchat."

# name -> (default keys, action, description, shown in the footer)
DEFAULTS: dict[str, tuple[str, str, str, bool]] = {
    "quit": ("ctrl+q", "quit", "Quit", True),
    "stop": ("ctrl+c,escape", "stop", "Stop reply", True),
    "help": ("f1,ctrl+question_mark", "help", "Help", True),
    "sidebar": ("ctrl+b", "toggle_sidebar", "History", True),
    "new": ("ctrl+n", "new_conversation", "New chat", True),
    "regenerate": ("ctrl+r", "regenerate", "Regenerate", True),
    "edit_last": ("ctrl+e", "edit_last", "Edit last", False),
    "copy_reply": ("ctrl+y", "copy_reply", "Copy reply", False),
    "copy_code": ("ctrl+k", "copy_code", "Copy code", False),
    "settings": ("ctrl+s", "settings", "Settings", True),
    "models": ("ctrl+o", "pick_model", "Models", False),
    "search": ("ctrl+f", "search", "Search", False),
    "rename": ("f2", "rename", "Rename", False),
    "delete": ("f8", "delete", "Delete chat", False),
    "export": ("ctrl+t", "export", "Export .md", False),
    "focus_prompt": ("ctrl+l", "focus_prompt", "Focus prompt", False),
}
# Bindings that win over the focused widget (the prompt's TextArea uses ctrl+c/e/k/y itself).
PRIORITY = ("quit", "stop", "help", "edit_last", "copy_reply", "copy_code")
# Keys handled inside the prompt widget itself (listed in the help screen, not remappable).
PROMPT_KEYS = (("enter", "Send the message"), ("ctrl+j / alt+enter", "Insert a newline"))


class KeymapError(ValueError):
    """A ``[keys]`` entry names an unknown binding or has no keys."""


def bindings() -> list[Binding]:
    """The chat screen's bindings with their default keys (``PRIORITY`` ones win over the
    focused widget, so Esc and Ctrl+C stop a reply even while typing)."""
    return [
        Binding(keys, action, desc, show=show, id=PREFIX + name, priority=name in PRIORITY)
        for name, (keys, action, desc, show) in DEFAULTS.items()
    ]


def keymap_from_config(keys: Mapping[str, str]) -> dict[str, str]:
    """``{binding id: keys}`` for ``App.set_keymap`` from the config's ``[keys]`` table.

    Raises:
        KeymapError: an unknown name (the message lists the known ones) or an empty value.
    """
    out: dict[str, str] = {}
    for name, value in keys.items():
        if name not in DEFAULTS:
            raise KeymapError(f"unknown key binding '{name}' in [keys]; known: "
                              + ", ".join(DEFAULTS))
        combo = ",".join(k.strip() for k in str(value).split(",") if k.strip())
        if not combo:
            raise KeymapError(f"key binding '{name}' has no keys")
        out[PREFIX + name] = combo
    return out


def parse_keymap(keys: Mapping[str, str], source: object = "the config file"
                 ) -> tuple[dict[str, str], list[str]]:
    """Like ``keymap_from_config``, but a bad entry is skipped, not fatal: returns the keymap
    of the valid entries and one message per bad one, naming ``source`` (the config file's
    path) and the entry. The messages hold no ``[...]``, which Textual would read as markup."""
    out: dict[str, str] = {}
    problems: list[str] = []
    for name, value in keys.items():
        try:
            out.update(keymap_from_config({name: value}))
        except KeymapError as exc:
            problems.append(f"{source}: keys.{name} ignored: {exc}".replace("[keys]",
                                                                            "the keys table"))
    return out, problems


def effective_keys(keymap: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(name, keys, description)`` for the help screen: defaults overridden by ``keymap``."""
    return [(name, keymap.get(PREFIX + name, keys), desc)
            for name, (keys, _action, desc, _show) in DEFAULTS.items()]
