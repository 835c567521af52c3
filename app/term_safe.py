"""Model text shown on a terminal: its control characters made visible, never obeyed.

A reply can carry terminal control sequences (an ANSI colour, an OSC window-title change, a
clear-screen), for instance when the model echoes text piped in from an untrusted source
(``git diff | localchat ask ...``). Written to a terminal as they are, the terminal would obey
them. :func:`visible_controls` turns every control character except newline and tab into a
visible stand-in; the answer kept in history, ``--json`` and output to pipes or files stay as
generated. (Terminal emulators' own guidance, e.g. xterm's, is to filter untrusted text the
same way.)
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, and the C1 controls (U+0080-U+009F: 8-bit CSI, OSC)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _stand_in(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode Control Pictures: ESC -> U+241B, BEL -> U+2407
    if code == 0x7F:
        return "\u2421"  # DEL symbol
    return f"\\x{code:02x}"  # C1: no picture exists; shown as its escape


def visible_controls(text: str) -> str:
    """``text`` with each control character other than ``\\n`` and ``\\t`` replaced by a
    visible stand-in that the terminal prints instead of obeying: C0 controls by their Unicode
    Control Picture (ESC -> U+241B, CR -> U+240D), DEL by U+2421, C1 controls (U+0080-U+009F)
    by their ``\\xNN`` escape. A ``\\r\\n`` line end counts as ``\\n``. Same length in lines;
    other text unchanged."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _CONTROL.sub(_stand_in, text)
