"""Where localchat keeps its files, and the user's config file.

Paths come from platformdirs (``user_cache_dir("localchat")`` and friends). When the
environment variable ``LOCALCHAT_HOME`` is set, all three live under it instead:
``$LOCALCHAT_HOME/cache``, ``$LOCALCHAT_HOME/data`` and ``$LOCALCHAT_HOME/config``. Each
function creates its folder on demand.

The config file is ``config_dir()/config.toml``; today it holds only ``default_model``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from localchat.engine.catalog import DEFAULT_MODEL
from localchat.engine.errors import LocalchatError

APP_NAME = "localchat"
HOME_ENV = "LOCALCHAT_HOME"


def _dir(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / kind
    else:
        path = Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Folder for re-downloadable files (model bundles); created if missing."""
    return _dir("cache")


def data_dir() -> Path:
    """Folder for the user's own data (conversation history); created if missing."""
    return _dir("data")


def config_dir() -> Path:
    """Folder holding ``config.toml``; created if missing."""
    return _dir("config")


@dataclass(frozen=True)
class Settings:
    """User settings from ``config.toml``; ``default_model`` is a model spec (alias, repo id,
    or path) used when no ``--model`` is given."""

    default_model: str = DEFAULT_MODEL


def config_path() -> Path:
    """The config file's path (it may not exist)."""
    return config_dir() / "config.toml"


def load_settings(path: Path | None = None) -> Settings:
    """Read ``path`` (default ``config_path()``); a missing file gives the defaults.

    Unknown keys are ignored. Raises ``LocalchatError`` (one line) when the file is not valid
    TOML or ``default_model`` is not a non-empty string.
    """
    path = config_path() if path is None else Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings()
    except OSError as exc:
        raise LocalchatError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise LocalchatError(f"reading {path} needs Python 3.11 or the tomli package") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise LocalchatError(f"config file {path} is not valid TOML: {exc}") from None
    model = data.get("default_model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model.strip():
        raise LocalchatError(f"config file {path}: default_model must be a non-empty string")
    return Settings(default_model=model.strip())
