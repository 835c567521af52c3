"""How ``ask`` shows an answer: raw text, progressive Markdown on a terminal, or code only.

Every writer takes text deltas (``write``) and ends the answer (``finish``), after which
``text`` holds the whole answer as generated. ``cli_io.AnswerWriter`` is the raw writer (pipes,
files, ``--raw``); ``MarkdownWriter`` renders on a terminal with Rich, one finished line at a
time (the current line is shown raw and replaced by its rendering once its newline arrives, so
nothing is rendered twice and nothing flickers); ``BufferedWriter`` keeps everything for the end
(``--json``, ``-x``). ``extract_code_blocks`` implements ``-x/--extract``.
"""

from __future__ import annotations

import re
import sys
from typing import IO, Any

from .term_safe import visible_controls

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
# -x's fences: any indentation (a block inside a list item), or right after a list marker
# (``1. ```bash``), group 1 being the item's content column to strip from the body
_INDENTED_FENCE = re.compile(r"^( *(?:(?:[-*+]|\d{1,9}[.)]) +)?)(`{3,}|~{3,})\s*([^`\s]*)")


def extract_code_blocks(text: str) -> list[str]:
    """The bodies of the fenced code blocks (CommonMark ``` and ~~~ fences) in ``text``, in
    order. A closing fence uses the opening fence's character, at least as many times. Only
    blocks with both fences count: a fence left open at the end (an interrupted reply, or an
    answer whose opening fence is missing, so the closing one looks like an opening) gives no
    block, never the prose after it. A fence may be indented (a block inside a list item,
    ``1. Step`` then a 3- or 4-space indented fence) or follow a list marker (``1. ```bash``):
    as CommonMark does, each body line loses up to as many leading spaces as the fence's
    column, so the code runs as written."""
    blocks: list[str] = []
    fence: str | None = None
    indent = 0
    body: list[str] = []
    for line in text.splitlines():
        match = _INDENTED_FENCE.match(line)
        if fence is None:
            if match:
                indent, fence, body = len(match.group(1)), match.group(2), []
        elif match and match.group(2)[0] == fence[0] and len(match.group(2)) >= len(fence) \
                and not match.group(3) and not line.strip().strip(fence[0]):
            blocks.append("\n".join(body))
            fence = None
        else:
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
    return blocks


class BufferedWriter:
    """Keeps the answer for the end (``--json``, ``-x``): ``write`` prints nothing."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, delta: str) -> None:
        """Append one delta."""
        self.text += delta

    def finish(self) -> None:
        """Nothing to flush: the caller prints ``text`` as it needs."""


class MarkdownWriter:
    """Progressive Markdown on a terminal (Rich): finished lines rendered once, the current
    line raw.

    Fenced code lines are shown with syntax colours (the fence's language), other lines as
    Markdown; blank lines at the start and the end of the answer are dropped and the output
    ends with one newline. Control characters other than newline and tab are shown as visible stand-ins
    (``term_safe``), never sent to the terminal; ``text`` keeps the answer as generated. Rich
    follows ``NO_COLOR`` (no colours, styles kept) and the terminal width.

    Args:
        stream: the terminal (default ``sys.stdout``).
        console: a ``rich.console.Console`` writing to ``stream`` (tests pass their own).
    """

    def __init__(self, stream: IO[str] | None = None, console: Any = None) -> None:
        from rich.console import Console

        self.stream = stream if stream is not None else sys.stdout
        self.console = console or Console(file=self.stream, highlight=False, soft_wrap=False)
        self.text = ""
        self._line = ""  # the current (unfinished) line, shown raw
        self._blank = 0  # finished blank lines not yet shown
        self._started = False  # a non-blank line finished yet (blank lines before it: dropped)
        self._fence: str | None = None
        self._lang = ""

    def write(self, delta: str) -> None:
        """Show a delta: raw on the current line; each finished line replaced by its render."""
        if not delta:
            return
        self.text += delta
        delta = visible_controls(delta)  # a terminal: show control characters, never obey them
        *done, rest = (self._line + delta).split("\n")
        if done:
            self._erase(self._line)
            for line in done:
                self._finish_line(line)
            self._line = ""
            self._show_raw(rest)
        else:
            self._show_raw(delta)
        self._line = rest
        self.stream.flush()

    def finish(self) -> None:
        """Render the last line (even if unfinished: an interrupted reply) and end the output
        with exactly one newline."""
        line, self._line = self._line, ""
        self._erase(line)
        if line.strip():
            self._finish_line(line)
        self.stream.flush()

    # -- internals -----------------------------------------------------------------------------

    def _show_raw(self, text: str) -> None:
        if text:
            self._flush_blank()
            self.stream.write(text)

    def _erase(self, raw: str) -> None:
        """Move back over the raw text of the current line (wrapped rows included)."""
        if not raw:
            return
        from rich.cells import cell_len

        width = max(1, self.console.width)
        rows_up = (cell_len(raw) - 1) // width
        self.stream.write("\r" + (f"\x1b[{rows_up}A" if rows_up else "") + "\x1b[J")

    def _flush_blank(self) -> None:
        if self._blank:
            self.stream.write("\n" * self._blank)
            self._blank = 0

    def _finish_line(self, line: str) -> None:
        match = _FENCE.match(line)
        if not line.strip() and self._fence is None:
            self._blank += self._started
            return
        self._started = True
        self._flush_blank()
        if self._fence is None and match:
            self._fence, self._lang = match.group(1), match.group(2) or "text"
            self._print_plain(line, "dim")
        elif self._fence is not None and match and match.group(1)[0] == self._fence[0] \
                and len(match.group(1)) >= len(self._fence) and not match.group(2):
            self._fence = None
            self._print_plain(line, "dim")
        elif self._fence is not None:
            self._print_code(line)
        else:
            self._print_markdown(line)

    def _print_plain(self, line: str, style: str) -> None:
        from rich.text import Text

        self.console.print(Text(line, style=style))

    def _print_code(self, line: str) -> None:
        from rich.syntax import Syntax

        self.console.print(Syntax(line, self._lang, background_color="default",
                                  word_wrap=True), end="")

    def _print_markdown(self, line: str) -> None:
        from rich.markdown import Markdown

        with self.console.capture() as capture:
            self.console.print(Markdown(line))
        rendered = capture.get().strip("\n")
        self.stream.write(rendered.rstrip() + "\n" if rendered else "\n")
