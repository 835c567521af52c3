"""Cheap conversion of plain command-line values, so parsing ``ask`` does not import pydantic.

Since typer 0.2x every parameter's value is converted by a pydantic ``TypeAdapter`` built on
first use (typer's ``_coercion.build_runtime_param``): parsing one ``ask`` imports pydantic
and builds some twenty adapters, about a third of a warm-server ``ask``'s own CPU time.
``install(command)`` gives each parameter of the command tree whose annotation is ``str``,
``bool``, ``int``, ``float`` or ``list[str]`` a converter that handles the canonical
spellings itself (a ``str`` or ``bool`` as is, ``-?[0-9]+`` as ``int``,
``-?[0-9]+(.[0-9]*)?`` as ``float``) and hands
anything else (``1e3``, ``+5``, ``abc``, ...) to typer's own converter, built only then, so
values and error messages are typer's: the tests compare both converters on the same inputs.

``flags_show_no_type(command)`` is the other adjustment of typer's command tree: on/off flags
show no ``<bool>`` value type in ``--help``.

It relies on two attributes of typer's parameters (``type_descriptor``, ``_runtime_param``);
with a typer that lacks them (older releases convert through click, without pydantic) it
leaves the command as it is.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]*)?")
_MISS = object()


def _convert(kind: Any, value: Any) -> Any:
    """``value`` converted for a parameter of type ``kind`` when it is a canonical spelling,
    else ``_MISS`` (typer's converter decides)."""
    if kind is str:
        return value if isinstance(value, str) else _MISS
    if kind is bool:
        return value if isinstance(value, bool) else _MISS
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isascii() and _INT.fullmatch(value):
            return int(value)
        return _MISS
    if kind is float:
        if isinstance(value, float):
            return value
        if isinstance(value, str) and value.isascii() and _FLOAT.fullmatch(value):
            return float(value)
        return _MISS
    if kind == list[str]:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        return _MISS
    return _MISS


class FastRuntimeParam:
    """typer's runtime-parameter interface (``coerce(value, param, ctx)``) for one plain
    parameter: ``None`` as typer gives it (``()`` for a repeatable option), canonical
    spellings converted here, the rest by ``fallback()`` (typer's own, built once)."""

    def __init__(self, kind: Any, fallback: Any) -> None:
        self.kind = kind
        self._fallback = fallback
        self._built: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = getattr(param, "multiple", False) or getattr(param, "nargs", 1) == -1
        if value is None:
            return () if multi else None
        if not (multi and isinstance(value, str)):  # typer refuses a bare str there
            converted = _convert(self.kind, value)
            if converted is not _MISS:
                return converted
        if self._built is None:
            self._built = self._fallback()
        return self._built.coerce(value, param=param, ctx=ctx)


def _kind(annotation: Any) -> Any:
    if annotation in (str, int, float, bool):
        return annotation
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return list[str]
    return None


def install(command: Any) -> int:
    """Give the plain parameters of ``command`` (a typer command or group, recursively, with
    the ``--help`` option each builds on first use) a ``FastRuntimeParam``; returns how many
    it changed (0 with a typer that does not convert through pydantic)."""
    count = sum(_install_param(param) for param in getattr(command, "params", ()))
    help_option = getattr(command, "get_help_option", None)
    if help_option is not None and count:
        def get_help_option(ctx: Any, _built: Any = help_option) -> Any:
            option = _built(ctx)
            if option is not None:
                _install_param(option)
            return option

        command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        count += install(sub)
    return count


def _install_param(param: Any) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", _MISS) is not None:
        return False
    if getattr(descriptor, "file_annotation", None) is not None:
        return False
    parameter_info = getattr(descriptor, "parameter_info", None)
    if any(getattr(parameter_info, name, None) is not None
           for name in ("parser", "click_type", "min", "max")):
        return False  # custom parsing or a range: typer's own converter checks it
    kind = _kind(getattr(descriptor, "annotation", None))
    if kind is None:
        return False
    param._runtime_param = FastRuntimeParam(kind, _typer_builder(descriptor))
    return True


def _typer_builder(descriptor: Any) -> Any:
    def build() -> Any:
        from typer._coercion import build_runtime_param

        return build_runtime_param(descriptor)

    return build


def flags_show_no_type(command: Any, parent: Any = None) -> None:
    """On/off flags (``--json``, ``--no-save``, ``--help``) show no value type in ``--help``:
    typer 0.2x prints ``<bool>`` there, as if the flag took a value, which click and ``llm``
    do not. The help option is the one the command builds (and keeps) for a context made as
    parsing makes it (the command's context settings, under its parent's)."""
    ctx = command.context_class(command, parent=parent, **command.context_settings)
    for param in [*command.params, command.get_help_option(ctx)]:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():  # a group's commands (history ...)
        flags_show_no_type(sub, ctx)
