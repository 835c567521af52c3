"""Model text on a terminal: control characters are shown, never obeyed (``app/term_safe.py``),
through both terminal writers, while pipes, files and the kept answer stay as generated."""

from __future__ import annotations

import io
import unicodedata

from rich.console import Console

from localchat.app.cli_io import AnswerWriter
from localchat.app.render import MarkdownWriter
from localchat.app.term_safe import visible_controls

EVIL = "Evil \x1b[31mRED\x1b[0m and \x1b]0;pwned-title\x07 and \x1b[2J end\x9b1;1H\n"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_control_but_newline_and_tab_becomes_visible():
    # the independent definition of a control character: Unicode category Cc
    text = "".join(chr(c) for c in range(0x00, 0x200))
    out = visible_controls(text)
    assert [ch for ch in out if unicodedata.category(ch) == "Cc"] == ["\t", "\n"]
    for c in range(0x200):
        ch = chr(c)
        got = visible_controls(ch)
        if unicodedata.category(ch) != "Cc" or ch in "\t\n":
            assert got == ch
        else:
            assert got != ch and all(unicodedata.category(g) != "Cc" for g in got)
    assert visible_controls("\x1b") == "\u241b" and visible_controls("\x07") == "\u2407"
    assert visible_controls("a\r\nb\rc") == "a\nb\u240dc"
    assert visible_controls("héllo ✓ 世界\tx\n") == "héllo ✓ 世界\tx\n"


def test_raw_writer_on_a_terminal_shows_controls_and_keeps_the_text():
    term = FakeTerminal()
    writer = AnswerWriter(term)
    for part in (EVIL[:9], EVIL[9:30], EVIL[30:]):
        writer.write(part)
    writer.finish()
    shown = term.getvalue()
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert shown == visible_controls(EVIL).rstrip("\n") + "\n"
    assert writer.text == EVIL


def test_raw_writer_into_a_pipe_writes_the_text_as_generated():
    pipe = io.StringIO()
    writer = AnswerWriter(pipe)
    writer.write(EVIL)
    writer.finish()
    assert pipe.getvalue() == EVIL


def test_markdown_writer_never_sends_the_reply_s_own_sequences():
    term = FakeTerminal()
    writer = MarkdownWriter(term, console=Console(file=term, width=80, force_terminal=True,
                                                  color_system=None))
    for part in (EVIL[:12], EVIL[12:40], EVIL[40:]):
        writer.write(part)
    writer.finish()
    shown = term.getvalue()
    # the writer's own cursor moves (ESC[nA, ESC[J) and Rich's styles may appear; the reply's
    # title change, bell, clear-screen, colour and 8-bit CSI may not
    for seq in ("\x1b]0;", "\x07", "\x1b[2J", "\x1b[31m", "\x9b"):
        assert seq not in shown
    assert "\u241b]0;pwned-title\u2407" in shown and "\u241b[2J" in shown
    assert writer.text == EVIL


def test_stderr_lines_escape_what_a_server_sent(capsys):
    """An endpoint's error text reached the terminal with its escapes intact
    (``answered 400: bad thing ... ^[[31mred``): ``error``, ``warn`` and ``note`` now print
    every control character (Unicode category Cc) escaped, on one line."""
    from localchat.app import cli_io

    for say in (cli_io.error, cli_io.warn, cli_io.note):
        say("answered 400: " + EVIL)
        line = capsys.readouterr().err
        assert line.endswith("\n") and line.count("\n") == 1
        assert not [ch for ch in line[:-1] if unicodedata.category(ch) == "Cc"], line
        assert "\\x1b[31mRED" in line
