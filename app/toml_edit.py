"""Set or remove one key of a small TOML file, keeping the user's other lines and comments.

The standard library reads TOML (``tomllib``) but does not write it. Config files here are
flat: top-level keys plus one level of tables (``[sampling]``). ``set_key`` edits the line that
defines the key (or inserts one) and then checks the result with ``tomllib``: when the edit
does not give exactly the intended data (a dotted key, a multi-line value), the file is
rewritten whole from the data instead (comments are lost only then).
"""

from __future__ import annotations

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

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_\-]+)\s*\]\s*(#.*)?$")


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

    The file is created when missing and replaced atomically. Raises ``tomllib.TOMLDecodeError``
    when the existing file is not valid TOML.
    """
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    data = tomllib.loads(text)
    want = json.loads(json.dumps(data))  # a deep copy
    section = want.setdefault(table, {}) if table else want
    if value is None:
        if key not in section:
            return False
        section.pop(key)
    else:
        section[key] = value
    if table and not want[table]:
        del want[table]
    new = _edit_lines(text, table, key, value)
    try:
        ok = new is not None and tomllib.loads(new) == want
    except tomllib.TOMLDecodeError:
        ok = False
    _atomic_write(path, new if ok else dumps(want))
    return True


def _edit_lines(text: str, table: str | None, key: str, value: Any | None) -> str | None:
    lines = text.splitlines()
    key_re = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=")
    current, found, section_end, table_seen = None, None, None, False
    first_header = len(lines)
    for i, line in enumerate(lines):
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
        if value is None:
            del lines[found]
        else:
            lines[found] = f"{key} = {format_value(value)}" + _trailing_comment(lines[found])
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
