"""Terminal output of ``ask``: progressive Markdown (checked on an emulated screen), ``--raw``,
``NO_COLOR`` (under a real pseudo-terminal), and ``-x`` code-block extraction."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from localchat.app.render import MarkdownWriter, extract_code_blocks

REPLY = ("Hello **world** and `code`.\n\n- first item\n- second item\n\n```python\n"
         "def f(x):\n    return x + 1\n```\nThe end.\n\n\n")
FAKE_CLI = Path(__file__).with_name("fake_cli.py")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def screen(output: str, width: int) -> list[str]:
    """The visible text after ``output`` on a ``width``-column terminal (SGR ignored):
    handles ``\\r``, ``\\n``, cursor-up ``ESC[nA``, erase-below ``ESC[J`` and line wrap."""
    rows: list[list[str]] = [[]]
    r = c = 0
    i = 0
    output = SGR.sub("", output)
    while i < len(output):
        m = re.match(r"\x1b\[(\d*)([AJ])", output[i:])
        if m:
            if m.group(2) == "A":
                r -= int(m.group(1) or 1)
            else:
                rows[r] = rows[r][:c]
                del rows[r + 1:]
            i += len(m.group(0))
            continue
        ch = output[i]
        i += 1
        if ch == "\r":
            c = 0
        elif ch == "\n":
            r, c = r + 1, 0
        else:
            if c == width:
                r, c = r + 1, 0
            while len(rows) <= r:
                rows.append([])
            row = rows[r]
            row.extend(" " * (c - len(row)))
            row[c:c + 1] = [ch]
            c += 1
        while len(rows) <= r:
            rows.append([])
    return ["".join(row).rstrip() for row in rows]


def render(deltas: list[str], width: int = 60) -> str:
    buf = io.StringIO()
    writer = MarkdownWriter(buf, Console(file=buf, force_terminal=True, width=width,
                                         highlight=False, soft_wrap=False))
    for d in deltas:
        writer.write(d)
    writer.finish()
    assert writer.text == "".join(deltas)
    return buf.getvalue()


def test_streamed_markdown_equals_one_shot_rendering():
    one_shot = render([REPLY])
    by_char = render(list(REPLY))
    assert screen(by_char, 60) == screen(one_shot, 60)
    lines = screen(one_shot, 60)
    assert lines[0] == "Hello world and code."  # rendered: no ** or backticks left
    assert "• first item" in [ln.strip() for ln in lines]
    assert "    return x + 1" in lines and "```python" in lines
    assert lines[-2:] == ["The end.", ""]  # one final newline, trailing blank lines dropped
    assert one_shot.endswith("\n") and not one_shot.endswith("\n\n")
    assert "\x1b[1m" in one_shot  # bold survives


def test_blank_lines_before_the_answer_are_dropped():
    out = render(["\n", "\n  \nHello **you**\n\nend"])
    assert screen(out, 60)[:3] == ["Hello you", "", "end"]


def test_wrapped_current_line_is_erased_before_its_rendering():
    long = "word " * 30  # 150 columns on a 40-column terminal: 4 rows shown raw
    deltas = [long[i:i + 7] for i in range(0, len(long), 7)] + ["\n**end**\n"]
    out = render(deltas, width=40)
    assert screen(out, 40) == screen(render(["".join(deltas)], width=40), 40)
    assert "\x1b[3A" in out  # moved up over the wrapped raw rows
    assert "**" not in "".join(screen(out, 40))


def test_interrupted_line_is_rendered_by_finish():
    out = render(["a **b**\nhalf **bo"])
    assert screen(out, 60)[:2] == ["a b", "half **bo"]


@pytest.mark.parametrize(("text", "blocks"), [
    ("x\n```py\na = 1\n```\ny\n~~~\nb\n```\n~~~\n", ["a = 1", "b\n```"]),
    ("````\n```\ninner\n```\n````", ["```\ninner\n```"]),
    ("no code", []),
    ("```\nunclosed\nstill", []),
    ("echo hi\n```\nThat prints hi.", []),  # the opening fence is missing
    ("```sh\nls\n```\nthen\n```\nopen", ["ls"]),
    ("  ```sh\n  ls\n  ```", ["ls"]),
    ("```\n```", [""]),
])
def test_extract_code_blocks(text, blocks):
    assert extract_code_blocks(text) == blocks


@pytest.mark.parametrize("text", [
    # a block in a numbered step: its 3-space indent made `-x > f.py` an IndentationError
    "1. Define it:\n   ```python\n   def f():\n       return 1\n   ```\n2. Call it.\n",
    # under `* item` a fence indented 4 spaces was not found at all
    "* item\n\n    ```py\n    a = 1\n    if a:\n      b = 2\n    ```\n",
    "  ```sh\n  ls\n   -la\n  ```\n",
    "Text\n\n```\nx = 1\n\n  y = 2\n```\n",
    # the fence on the list marker's line: the prose of item 2 was printed as code
    "1. ```bash\n   pip install x\n   ```\n2. Run:\n   ```bash\n   x --run\n   ```\n",
    "- ```python\n  a = 1\n    b\n  ```\n",
    "10) ```\n    ten\n    ```\n",
])
def test_extracted_blocks_are_what_a_commonmark_parser_finds(text):
    """The oracle: markdown-it-py (Rich's Markdown parser) in CommonMark mode, whose fence
    tokens hold each body with the opening fence's indentation removed."""
    from markdown_it import MarkdownIt

    want = [tok.content.removesuffix("\n") for tok in MarkdownIt("commonmark").parse(text)
            if tok.type == "fence"]
    assert want and extract_code_blocks(text) == want


def has_colour(text: str) -> bool:
    """True when an SGR sequence sets a foreground colour (30-37, 38;..., 90-97)."""
    for params in re.findall(r"\x1b\[([0-9;]*)m", text):
        codes = [int(p) for p in params.split(";") if p]
        if any(30 <= c <= 38 or 90 <= c <= 97 for c in codes):
            return True
    return False


def run_on_pty(args: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run the fake-engine CLI with stdout on a pseudo-terminal; (exit code, tty bytes, stderr)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(FAKE_CLI), *args], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = proc.stderr.read()
    return proc.wait(timeout=60), b"".join(chunks), err


@pytest.mark.skipif(os.name != "posix", reason="needs a pseudo-terminal")
def test_terminal_output_markdown_raw_and_no_color(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(LOCALCHAT_HOME=str(tmp_path), FAKE_REPLY=REPLY, FAKE_CHUNK="3", TERM="xterm",
               COLUMNS="80")
    code, out, err = run_on_pty(["ask", "hi"], env)
    assert code == 0 and err == b""
    text = out.decode()
    assert "\x1b[" in text and "Hello world and code." in screen(text.replace("\r\n", "\n"), 80)
    assert has_colour(text)  # colours by default
    code, whole, _ = run_on_pty(["ask", "hi", "--no-stream"], env)
    assert code == 0 and "\x1b[J" not in whole.decode()  # nothing raw to erase: one write
    assert screen(whole.decode().replace("\r\n", "\n"), 80) == screen(
        text.replace("\r\n", "\n"), 80)
    code, out, _ = run_on_pty(["ask", "hi", "--raw"], env)
    assert code == 0 and out.decode() == REPLY.rstrip("\n").replace("\n", "\r\n") + "\r\n"
    code, out, _ = run_on_pty(["ask", "hi"], {**env, "NO_COLOR": "1"})
    text = out.decode()
    assert code == 0 and "\x1b[1m" in text  # styles stay ...
    assert not has_colour(text)  # ... colours go


@pytest.mark.parametrize(("term", "markdown"), [("xterm-256color", True), ("dumb", False)])
def test_a_dumb_terminal_gets_plain_text(monkeypatch, term, markdown):
    """``TERM=dumb`` (Emacs' shell) showed the Markdown writer's redraw codes as text, the
    answer twice (a new-user trial): on such a terminal ``ask`` streams plain text."""
    from types import SimpleNamespace

    from localchat.app import ask_reply, cli_io

    monkeypatch.setattr(cli_io, "stream_isatty", lambda stream: True)
    monkeypatch.setenv("TERM", term)
    args = SimpleNamespace(raw=False, json=False, extract=False, no_stream=False)
    writer = ask_reply.make_writer(args)
    assert isinstance(writer, MarkdownWriter) == markdown
    assert isinstance(writer, cli_io.AnswerWriter) == (not markdown)
