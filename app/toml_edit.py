"""Set or remove one key of a small TOML file, keeping the user's other lines and comments.

The standard library reads TOML (``tomllib``) but does not write it. Config files here are
flat: top-level keys plus one level of tables, written as ``[sampling]``, as dotted keys
(``sampling.top_p = 0.8``) or as a one-line inline table (``sampling = { top_p = 0.8 }``).
``set_key`` edits the line that defines the key (or inserts one) and then checks the result
with ``tomllib``; a multi-line value is replaced whole. When the edit does not give exactly
the intended data, the file is rewritten whole from the data instead, but only when it holds
no comment to lose and no value ``dumps`` cannot write (``CannotEdit`` otherwise). A leading
byte-order mark (Windows editors) is read past and written back.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

BOM = "\ufeff"  # a byte-order mark some editors write first: read past, kept
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_\-]+)\s*\]\s*(#.*)?$")


class CannotEdit(ValueError):
    """The edit can only be made by rewriting the whole file, and that would lose something:
    the file's comments, or a value ``dumps`` cannot write (a date, a nested table)."""


def format_value(value: Any) -> str:
    """A TOML literal for a str, int or finite float (``bool`` as ``true``/``false``).

    Raises:
        TypeError: any other type.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):  # JSON string escapes are valid TOML basic-string escapes
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps(data: dict[str, Any]) -> str:
    """Serialize flat data: top-level scalars first, then one ``[table]`` per dict value."""
    lines = [f"{k} = {format_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict) and table:
            lines += ["", f"[{name}]"] + [f"{k} = {format_value(v)}" for k, v in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def set_key(path: Path, table: str | None, key: str, value: Any | None) -> bool:
    """Set ``[table].key = value`` in the file at ``path`` (``value`` None removes the key).
    Returns False, writing nothing, when ``value`` is None and the file does not set the key.

    The file is created when missing and replaced atomically.

    Raises:
        tomllib.TOMLDecodeError: the existing file is not valid TOML.
        CannotEdit: no line edit gives the data, and a whole rewrite would drop the file's
            comments or cannot write one of its values (nothing is written).
    """
    text = bom = ""
    if path.exists():
        with open(path, encoding="utf-8", newline="") as f:  # (CRLF kept, written back)
            text = f.read()
        if text.startswith(BOM):  # (an editor's byte-order mark: kept, written back)
            text, bom = text[1:], BOM
    data = tomllib.loads(text)
    want = copy.deepcopy(data)
    section = want.setdefault(table, {}) if table else want
    if value is None:
        if key not in section:
            return False
        section.pop(key)
    else:
        section[key] = value
    if table and not want[table]:
        del want[table]
    new = _edit_lines(text, table, key, value, want)
    try:
        ok = new is not None and _drop_empty_tables(tomllib.loads(new)) == \
            _drop_empty_tables(want)
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        if "#" in text:  # (a comment, or a '#' in a string: either way, no rewrite)
            raise CannotEdit(f"{path} writes {table or key} in a form this edit cannot change "
                             "without losing the file's comments: set it in an editor")
        try:
            new = dumps(want)
        except TypeError as exc:
            raise CannotEdit(f"{path} holds a value this edit cannot write back ({exc}): set "
                             f"{key} in an editor") from None
    if "\r\n" in text:  # the file's own line endings
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    _atomic_write(path, bom + new)
    return True


def _edit_lines(text: str, table: str | None, key: str, value: Any | None,
                want: dict[str, Any]) -> str | None:
    lines = text.splitlines()
    starts = _statement_starts(lines)
    if table is not None and not any((h := _HEADER.match(lines[i])) and h.group(1) == table
                                     for i in starts):
        edited = _edit_top_level_table(lines, starts, table, key, value, want)
        if edited is not None:
            return edited
    key_re = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=")
    current, found, section_end, table_seen = None, None, None, False
    first_header = len(lines)
    for i in starts:
        line = lines[i]
        header = _HEADER.match(line)
        if header:
            first_header = min(first_header, i)
            if current == table and table is not None:
                section_end = i
            current = header.group(1)
            table_seen = table_seen or current == table
            continue
        if current == table and key_re.match(line):
            found = i
    if table is not None and table_seen and section_end is None:
        section_end = len(lines)
    if found is not None:
        end = _value_end(lines, found)
        comment = _trailing_comment("\n".join(lines[found:end]))
        lines[found:end] = [] if value is None else [f"{key} = {format_value(value)}" + comment]
    elif value is None:
        return text
    elif table is None:
        at = first_header
        while at > 0 and not lines[at - 1].strip() and at < len(lines):
            at -= 1
        lines.insert(at, f"{key} = {format_value(value)}")
    elif table_seen:
        at = section_end
        while at > 0 and not lines[at - 1].strip():
            at -= 1
        lines.insert(at, f"{key} = {format_value(value)}")
    else:
        lines += ([""] if lines and lines[-1].strip() else []) + [f"[{table}]"]
        lines.append(f"{key} = {format_value(value)}")
    return "\n".join(lines) + "\n"


def _edit_top_level_table(lines: list[str], starts: list[int], table: str, key: str,
                          value: Any | None, want: dict[str, Any]) -> str | None:
    """The edit of ``[table].key`` where the top level (above any header) writes ``table``
    as dotted keys or as a one-line inline table; None when it does neither. ``starts``:
    ``_statement_starts(lines)``."""
    top_level = []
    for i in starts:
        if _HEADER.match(lines[i]):
            break
        top_level.append(i)
    t = re.escape(table)
    dotted = re.compile(rf"^\s*{t}\s*\.\s*(\"?){re.escape(key)}\1\s*=")
    any_dotted = re.compile(rf"^\s*{t}\s*\.")
    inline = re.compile(rf"^\s*{t}\s*=\s*\{{")
    for i in top_level:
        if dotted.match(lines[i]):  # (its value may span lines: replaced whole)
            end = _value_end(lines, i)
            comment = _trailing_comment("\n".join(lines[i:end]))
            lines[i:end] = [] if value is None else \
                [f"{table}.{key} = {format_value(value)}" + comment]
            return "\n".join(lines) + "\n"
        if inline.match(lines[i]):
            body = ", ".join(f"{k} = {format_value(v)}" for k, v in want.get(table, {}).items())
            comment = _trailing_comment(lines[i])
            lines[i:i + 1] = [f"{table} = {{ {body} }}{comment}"] if body else []
            return "\n".join(lines) + "\n"
    last = max((i for i in top_level if any_dotted.match(lines[i])), default=None)
    if last is None or value is None:
        return None
    lines.insert(_value_end(lines, last), f"{table}.{key} = {format_value(value)}")
    return "\n".join(lines) + "\n"


def _drop_empty_tables(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less its empty tables (a ``[sampling]`` header, comments under it, left by
    unsetting its last key means no sampling setting, as no table does)."""
    return {k: v for k, v in data.items() if v != {}}


def _statement_starts(lines: list[str]) -> list[int]:
    """The indices of the lines that start a statement (a header, a ``key = value``, a
    comment, a blank): the lines inside a multi-line value (a ``\"\"\"`` string, an
    array) are skipped, so a ``key =`` or ``[table]`` written inside one is not taken for
    the real thing."""
    starts, i = [], 0
    while i < len(lines):
        starts.append(i)
        i = _value_end(lines, i) if "=" in lines[i] else i + 1
    return starts


def _value_end(lines: list[str], i: int) -> int:
    """One past the last line of the ``key = value`` that starts at line ``i``: the first
    span that parses, so a multi-line string or array is taken whole (``i + 1`` when none)."""
    for j in range(i + 1, len(lines) + 1):
        try:
            tomllib.loads("\n".join(lines[i:j]))
        except tomllib.TOMLDecodeError:
            continue
        return j
    return i + 1


def _trailing_comment(line: str) -> str:
    """The comment ending ``line`` (``key = value  # note``), with the spaces before it, or "":
    the first ``#`` before which the line parses as TOML on its own (a ``#`` inside a string
    does not)."""
    for i, ch in enumerate(line):
        if ch == "#":
            try:
                tomllib.loads(line[:i])
            except tomllib.TOMLDecodeError:
                continue
            head = line[:i].rstrip()
            return line[len(head):]
    return ""


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
