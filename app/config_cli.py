"""``localchat config``: where the config file is, what is in effect, and setting keys.

``show`` prints every key with its value in effect and where it comes from (``config``,
``env``, the default model's recommendation (``model_defaults.py``), ``default``); precedence for commands is flag > environment > config file > default.
``set KEY VALUE`` checks the value as the commands will (an unknown key or a bad value is a
one-line usage error naming the key, exit 2) and edits only that line of ``config.toml``.
A file that does not parse is never edited (``set``/``unset`` exit 1 naming the file, the
line and column, and how to fix it): the user's text is theirs to repair.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from localchat.app import cli_io

config_app = typer.Typer(
    name="config", help="Show and change settings (config.toml).", no_args_is_help=True,
    add_completion=False,
)
KeyArg = Annotated[str, typer.Argument(help="A key from 'localchat config show'.")]


@config_app.command()
def path() -> None:
    """Print the config file's path (it may not exist yet)."""
    from localchat.app.settings import config_path

    typer.echo(str(config_path()))


@config_app.command()
def show() -> None:
    """Print every key: value in effect (TOML syntax) and its source, or its default."""
    from localchat.app import toml_edit
    from localchat.app.model_defaults import recommended_sampling
    from localchat.app.settings import KEYS, load_settings
    from localchat.engine.sampling_params import SamplingParams

    settings = load_settings()
    defaults = SamplingParams()
    recommended, rec_origin = recommended_sampling(settings.default_model)
    for name, key in KEYS.items():
        value = settings.get(name)
        if name == "api_key" and value:
            value = "********"  # a secret: never printed
        source = settings.sources.get(name)
        if source:
            origin = "environment " + key.env if source == "env" else "config file"
            typer.echo(f"{name} = {toml_edit.format_value(value)}  # {origin}")
        elif value is not None:  # a built-in default (default_model)
            typer.echo(f"{name} = {toml_edit.format_value(value)}  # default")
        elif key.table and key.field in recommended:
            typer.echo(f"{name} = {toml_edit.format_value(recommended[key.field])}  # model "
                       f"{settings.default_model} ({rec_origin}); your settings override it")
        else:
            default = getattr(defaults, key.field, None) if key.table else None
            shown = "not set" if default is None else f"default {default}"
            typer.echo(f"# {name}: {shown} ({key.help}; env {key.env})")
    for name in settings.unknown_keys:
        cli_io.warn(unknown_key_warning(name))


def unknown_key_warning(name: str) -> str:
    """The warning line for a key of config.toml that localchat does not know (``name``,
    dotted): a sampling field written at the top level (``temperature = 0.3``) is named
    with where it goes."""
    from localchat.app.settings import KEYS, SAMPLING_TABLE

    if "." not in name and f"{SAMPLING_TABLE}.{name}" in KEYS:
        return (f"config file: unknown key '{name}' (ignored): a sampling setting goes under "
                f"[{SAMPLING_TABLE}], or write {SAMPLING_TABLE}.{name} (localchat config set "
                f"{name} VALUE does that)")
    return f"config file: unknown key '{name}' (ignored; see 'localchat config show')"


@config_app.command()
def get(key: KeyArg) -> None:
    """Print KEY's value in effect (as 'config show' finds it: environment, config file,
    the model's recommendation, the default); exit 1, with a note, when it has none."""
    from localchat.app import settings as settings_mod
    from localchat.app.model_defaults import recommended_sampling
    from localchat.engine.sampling_params import SamplingParams

    try:
        found = settings_mod.lookup_key(key)
    except settings_mod.SettingError as exc:
        raise cli_io.CliUsageError(str(exc)) from None
    settings = settings_mod.load_settings()
    value = settings.get(found.name)
    if value is None and found.table:
        value = recommended_sampling(settings.default_model)[0].get(found.field)
        if value is None:
            value = getattr(SamplingParams(), found.field, None)
    if value is None:
        cli_io.note(f"{found.name} is not set")
        raise typer.Exit(1)
    typer.echo(", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))


# a value may start with "-" (a negative penalty, a system prompt "-be brief")
@config_app.command("set", context_settings={"ignore_unknown_options": True})
def set_(key: KeyArg, value: Annotated[str, typer.Argument(help="The new value.")]) -> None:
    """Set KEY to VALUE in config.toml (checked first; other lines are kept)."""
    _write(key, value)


@config_app.command()
def unset(key: KeyArg) -> None:
    """Remove KEY from config.toml (its default applies again)."""
    _write(key, None)


def _write(name: str, value: str | None) -> None:
    from localchat.app import settings

    try:  # an unknown key or a bad value is a usage error (exit 2) ...
        key = settings.lookup_key(name)
        if value is not None:
            check_setting(key, settings.parse_value(key, value))
            value = absolute_model_path(key, value)
    except settings.SettingError as exc:
        raise cli_io.CliUsageError(str(exc)) from None
    key, parsed, changed = settings.set_value(name, value)  # ... an unreadable file: exit 1
    if not changed:
        cli_io.note(f"{key.name} is not set in {settings.config_path()}: nothing to remove")
        return
    shown = "removed" if parsed is None else \
        ("set" if key.name == "api_key" else f"= {parsed!r}")  # a secret: never printed
    cli_io.note(f"{key.name} {shown} in {settings.config_path()}")


def theme_problem(value: str) -> str | None:
    """Why ``value`` names no theme (localchat's, by full or short name, or one of Textual's
    built-in ones), or None when it names one."""
    from localchat.themes import THEMES, resolve_theme_name

    names = [t.name for t in THEMES]
    try:
        from textual.theme import BUILTIN_THEMES
    except ImportError:  # pragma: no cover - textual is a dependency
        BUILTIN_THEMES = {}
    if resolve_theme_name(value) in {*names, *BUILTIN_THEMES}:
        return None
    short = [n.removeprefix("localchat-") for n in names]
    return f"no such theme (localchat's: {', '.join(short)}; or a Textual theme)"


def absolute_model_path(key: Any, value: str) -> str:
    """``value`` for ``key`` (a ``settings.Key``) as ``config set`` writes it: a relative path
    to an existing model file or folder for ``default_model`` or ``draft`` made absolute, so
    that it names the same model from any folder (``ask -m ./x.gguf`` stores the absolute
    path in the history likewise); anything else (an alias, ``org/name``, ``~/...``, an
    absolute path) as given."""
    from localchat.engine.hub.catalog import resolve_alias

    path = Path(value.strip())
    if key.name not in ("default_model", "draft") or path.is_absolute() or \
            value.strip().startswith("~") or _draft_word(key, value) or \
            resolve_alias(value) or not path.exists():
        return value
    return os.path.abspath(path)  # (a symlink stays one: repointing it repoints the model)


def _draft_word(key: Any, value: str) -> bool:
    """``value`` is one of ``draft``'s words (``auto``, ``ngram``, ``none`` / ``off``), not a
    model."""
    from localchat.app.engine_loader import NGRAM, NO_DRAFT

    return key.name == "draft" and value.strip().lower() in (*NO_DRAFT, "auto", NGRAM)


def check_setting(key: Any, value: Any) -> None:
    """Refuse a value that parses but names nothing, before ``config set`` writes it
    (``key``: a ``settings.Key``, ``value`` as ``settings.parse_value`` returned it):
    ``default_model`` must be a catalog alias, a Hub repo id (``org/name``), a GGUF file of
    one (``org/name:Q4_K_M``, a file's URL) or an existing file or folder, and ``draft`` one of those or ``auto``, ``ngram``, ``none`` / ``off``;
    ``theme`` one of localchat's themes or Textual's built-in ones.

    Raises:
        SettingError: the value names no model or theme; names the key and ``config.toml``.
    """
    reason = None
    if key.name in ("default_model", "draft"):
        from localchat.engine.hub.catalog import resolve_alias
        from localchat.engine.hub.resolve import parse_gguf_spec, parse_repo_spec

        if not (_draft_word(key, value) or resolve_alias(value) or parse_repo_spec(value)
                or parse_gguf_spec(value) or Path(value).expanduser().exists()):
            reason = ("not " + ("auto, ngram, none, " if key.name == "draft" else "")
                      + "a catalog alias, a Hub repo id (org/name, org/name:Q4_K_M) or an "
                      "existing file or folder (see 'localchat models')")
    elif key.name == "theme":
        reason = theme_problem(value)
    if reason:
        from localchat.app.settings import SettingError, config_path

        raise SettingError(f"{key.name} = {value!r} not written to {config_path()}: {reason}")
