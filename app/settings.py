"""Where localchat keeps its files, and the user's config file.

Paths come from platformdirs (``user_cache_dir("localchat")`` and friends). When the
environment variable ``LOCALCHAT_HOME`` is set, all three live under it instead:
``$LOCALCHAT_HOME/cache``, ``$LOCALCHAT_HOME/data`` and ``$LOCALCHAT_HOME/config``. Each
function creates its folder on demand.

The config file is ``config_dir()/config.toml``: ``default_model``, ``draft``, ``quant``,
``context`` (tokens per conversation, prompt + reply; as llama.cpp's ``-c``),
``kv_cache_dtype`` (the KV cache's element type; as llama.cpp's ``-ctk`` / ``-ctv``), ``theme``,
``system_prompt``, ``endpoint``, ``api_key``, ``keep_alive`` (``ask --keep-alive``), a ``[sampling]`` table of ``SamplingParams`` defaults (the keys
are listed in ``KEYS``) and a ``[keys]`` table of TUI key bindings (``stop = "escape,ctrl+c"``;
names in ``localchat.app.tui.keymap``, checked by the TUI). Each key can also come from the environment (``LOCALCHAT_`` + the key's
last part in capitals: ``LOCALCHAT_DEFAULT_MODEL``, ``LOCALCHAT_TEMPERATURE``). Precedence, as
applied by the CLI and the TUI: command-line flag > environment > config file > built-in default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from localchat.engine.config import KV_CACHE_DTYPES
from localchat.engine.errors import LocalchatError
from localchat.engine.hub.catalog import DEFAULT_MODEL

APP_NAME = "localchat"
HOME_ENV = "LOCALCHAT_HOME"


def _dir(kind: str) -> Path:
    """The ``kind`` folder (cache, data, config), created if missing, private to the user
    (0700 whatever the umask, as ``~/.ssh``; a missing ``LOCALCHAT_HOME`` too): they hold the
    conversations, maybe an API key, and the kernel library localchat loads.

    Raises:
        SettingError: it cannot be created or is not a folder (``LOCALCHAT_HOME`` names a
            file, a read-only place); the message names the path and the problem.
    """
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / kind
    else:
        path = Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME))
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        where = f"{HOME_ENV}={home}: " if home else ""
        blocker = next((p for p in (path, *path.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            problem = f"{blocker} is a file, not a folder"
        else:
            problem = f"cannot create the folder {path}: {exc.strerror or exc}"
        raise SettingError(f"{where}{problem}") from None
    if not path.is_dir():
        raise SettingError(f"{path} is not a folder")
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


def config_path() -> Path:
    """The config file's path (it may not exist)."""
    return config_dir() / "config.toml"


QUANT_CHOICES = ("auto", "native", "none", "fp8", "int8", "int4")
SAMPLING_TABLE = "sampling"
KEYS_TABLE = "keys"  # TUI key bindings: binding name -> comma-separated keys


@dataclass(frozen=True)
class Key:
    """One setting: its dotted ``name`` (``sampling.temperature``), Python type, help text and
    allowed values (``choices``; None allows any non-empty string)."""

    name: str
    type: type
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def table(self) -> str | None:
        """The TOML table holding the key (``sampling``), or None for a top-level key."""
        return self.name.split(".")[0] if "." in self.name else None

    @property
    def field(self) -> str:
        """The key's last part: the ``SamplingParams`` field for sampling keys."""
        return self.name.split(".")[-1]

    @property
    def env(self) -> str:
        """The environment variable that overrides the config file."""
        return "LOCALCHAT_" + self.field.upper()


_SAMPLING_KEYS = (
    ("temperature", float, "softmax temperature, 0 is greedy"),
    ("top_p", float, "nucleus mass in (0, 1]"),
    ("top_k", int, "keep the k most likely tokens, 0 keeps all"),
    ("min_p", float, "drop tokens below min_p x the top probability"),
    ("repetition_penalty", float, "transformers semantics, 1 disables"),
    ("presence_penalty", float, "OpenAI semantics, in [-2, 2]"),
    ("frequency_penalty", float, "OpenAI semantics, in [-2, 2]"),
    ("max_tokens", int, "most tokens per reply"),
    ("seed", int, "random seed"),
)
KEYS: dict[str, Key] = {k.name: k for k in (
    Key("default_model", str, "model used when no --model is given"),
    Key("draft", str, "draft model for speculative decoding"),
    Key("quant", str, "weight format: " + "|".join(QUANT_CHOICES), QUANT_CHOICES),
    Key("context", int, "context size in tokens (prompt + reply); default: the model's, "
        "at most 8192 on CPU"),
    Key("kv_cache_dtype", str, "KV cache element type: " + "|".join(KV_CACHE_DTYPES)
        + " (auto: float16 where the engine computes in float32 on CPU, else the model's)",
        KV_CACHE_DTYPES),
    Key("theme", str, "TUI theme name"),
    Key("system_prompt", str, "system prompt used when no --system is given"),
    Key("endpoint", str, "OpenAI-compatible server to use instead of a local engine"),
    Key("api_key", str, "bearer key sent to the endpoint (or a keyed localchat serve)"),
    Key("keep_alive", str, "ask answers through a server started for the model and kept "
        "loaded this long after its last request (5m, 1h; 0: none)"),
    *(Key(f"{SAMPLING_TABLE}.{n}", t, h) for n, t, h in _SAMPLING_KEYS),
)}


@dataclass(frozen=True)
class Settings:
    """Resolved settings: config file, then environment over it (``load_settings``).

    ``default_model`` is a model spec (alias, repo id, or path); ``draft``, ``quant``,
    ``context`` (tokens), ``theme`` and ``system_prompt`` are None when not set; ``sampling`` maps ``SamplingParams`` field
    names to the values set. ``sources`` maps each set key name to ``"config"`` or ``"env"``;
    ``unknown_keys`` lists config-file keys that localchat does not know (they are ignored).
    """

    default_model: str = DEFAULT_MODEL
    draft: str | None = None
    quant: str | None = None
    context: int | None = None
    kv_cache_dtype: str | None = None
    theme: str | None = None
    system_prompt: str | None = None
    endpoint: str | None = None
    api_key: str | None = None
    keep_alive: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    unknown_keys: tuple[str, ...] = field(default=(), compare=False)

    def get(self, name: str) -> Any:
        """A key's value by dotted name (None when not set; ``default_model`` has a default)."""
        key = lookup_key(name)
        if key.table:
            return self.sampling.get(key.field)
        return getattr(self, key.name)


class SettingError(LocalchatError):
    """An unknown key or a bad value; the message names the key (and where it came from)."""


def lookup_key(name: str) -> Key:
    """The ``Key`` for a dotted name; a bare sampling field (``temperature``) is accepted too.

    Raises:
        SettingError: no such key (the message lists the known ones).
    """
    name = name.strip()
    key = KEYS.get(name) or KEYS.get(f"{SAMPLING_TABLE}.{name}")
    if key is None:
        raise SettingError(f"unknown config key '{name}'; known keys: {', '.join(KEYS)}")
    return key


API_KEY_RULE = "printable ASCII without spaces (an HTTP header carries no other bytes)"


def api_key_problem(key: str) -> str | None:
    """``API_KEY_RULE`` when ``key`` breaks it, else None. A bearer key travels in the
    ``Authorization`` header: httpx and the openai client refuse other characters with an
    internal error, and a server given one could only match clients that sent its latin-1
    bytes. The key itself is never put in a message."""
    return None if key and all("!" <= ch <= "~" for ch in key) else API_KEY_RULE


def endpoint_problem(url: str) -> str | None:
    """What an endpoint URL must be, when ``url`` is not that: an http(s) URL with a host and,
    if any, a valid port (``http://[::1`` passed the scheme check and failed inside the HTTP
    client as an internal error). None for a usable URL."""
    from urllib.parse import urlsplit

    want = "an http:// or https:// URL (e.g. http://127.0.0.1:8088)"
    if not url.strip().lower().startswith(("http://", "https://")):
        return want
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return f"{want}; {exc}"
    return None if parts.hostname else f"{want}; it names no host"


def parse_value(key: Key, raw: Any) -> Any:
    """Convert and check a value for ``key`` (text from the command line or environment, or a
    TOML value). Sampling values are checked by ``SamplingParams`` itself.

    Raises:
        SettingError: the value has the wrong type or is out of range; names the key.
    """
    if key.name == "keep_alive" and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = f"{raw:f}".rstrip("0").rstrip(".")  # TOML ``keep_alive = 300``: seconds
    if key.type is str:
        if not isinstance(raw, str) or not raw.strip():
            what = "a duration (300, 90s, 5m)" if key.name == "keep_alive" else \
                "a non-empty string"
            raise SettingError(f"{key.name} must be {what}, got {raw!r}")
        value: Any = raw.strip()
        if key.choices and value not in key.choices:
            raise SettingError(f"{key.name} must be one of {', '.join(key.choices)}, "
                               f"got {value!r}")
        if key.name == "api_key" and (problem := api_key_problem(value)) is not None:
            raise SettingError(f"api_key must be {problem}")
        if key.name == "endpoint" and (problem := endpoint_problem(value)) is not None:
            raise SettingError(f"endpoint must be {problem}, got {value!r}")
        if key.name == "keep_alive":
            from localchat.app.keep_alive import parse_duration

            try:
                parse_duration(value)
            except ValueError as exc:
                raise SettingError(f"{key.name}: {exc}") from None
        return value
    try:
        if isinstance(raw, bool) or (key.type is int and isinstance(raw, float)):
            raise ValueError
        value = key.type(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        kind = "an integer" if key.type is int else "a number"
        raise SettingError(f"{key.name} must be {kind}, got {raw!r}") from None
    if key.table != SAMPLING_TABLE:  # context
        from localchat.app.load_options import CONTEXT_TOO_SMALL, MIN_CONTEXT

        if value < MIN_CONTEXT:
            raise SettingError(f"{key.name} {value}: {CONTEXT_TOO_SMALL}")
        return value
    from localchat.engine.sampling_params import SamplingParams

    try:
        SamplingParams(**{key.field: value})
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith(key.field):
            msg = key.name + msg[len(key.field):]
        raise SettingError(msg) from None
    return value


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None
                  ) -> Settings:
    """Read ``path`` (default ``config_path()``), then apply ``environ`` (default
    ``os.environ``) over it. A missing file gives the defaults; empty variables are unset.

    Raises:
        SettingError: the file is not valid TOML, or a value in it or in the environment is
            bad; the message names the file or variable and the key.
    """
    path = config_path() if path is None else Path(path)
    environ = os.environ if environ is None else environ
    data = _read_toml(path)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    unknown: list[str] = []
    bindings: dict[str, str] = {}
    for name, raw in _flatten(data):
        if name.startswith(KEYS_TABLE + "."):
            if not isinstance(raw, str):
                raise SettingError(f"config file {path}: {name} must be a string of keys "
                                   f"(\"ctrl+s,f2\"), got {raw!r}")
            bindings[name.split(".", 1)[1]] = raw
            continue
        key = KEYS.get(name)
        if key is None:
            unknown.append(name)
            continue
        try:
            values[name] = parse_value(key, raw)
        except SettingError as exc:
            raise SettingError(f"config file {path}: {exc}") from None
        sources[name] = "config"
    for key in KEYS.values():
        raw = environ.get(key.env, "")
        if raw.strip():
            try:
                values[key.name] = parse_value(key, raw)
            except SettingError as exc:
                raise SettingError(f"environment variable {key.env}: {exc}") from None
            sources[key.name] = "env"
    top = {k: v for k, v in values.items() if KEYS[k].table is None}
    sampling = {KEYS[k].field: v for k, v in values.items() if KEYS[k].table}
    return Settings(**top, sampling=sampling, keys=bindings, sources=sources,
                    unknown_keys=tuple(unknown))


def set_value(name: str, raw: str | None, path: Path | None = None) -> tuple[Key, Any, bool]:
    """Check ``raw`` for the key ``name`` and write it to the config file (None removes the
    key). Other lines and comments of the file are kept. Returns the key, the parsed value and
    whether the file changed (False: a key to remove that the file does not set).

    Raises:
        SettingError: unknown key, bad value, the current file is not valid TOML, or it
            cannot be written (read-only, disk full); names the file.
    """
    from localchat.app import toml_edit

    key = lookup_key(name)
    value = None if raw is None else parse_value(key, raw)
    path = config_path() if path is None else Path(path)
    # refuse to edit a file that does not parse (as ``git config`` does): it stays byte for byte
    command = "localchat config " + ("unset" if raw is None else "set")
    _read_toml(path, fix=f"left unchanged: fix it in an editor (or move it aside to start "
                         f"over), then run '{command}' again")
    try:
        changed = toml_edit.set_key(path, key.table, key.field, value)
    except OSError as exc:  # a read-only file or folder, a full disk
        raise SettingError(f"cannot write config file {path}: {exc.strerror or exc}") from None
    except toml_edit.CannotEdit as exc:
        raise SettingError(f"config file {exc}; left unchanged") from None
    return key, value, changed


def _read_toml(path: Path, fix: str | None = None) -> dict[str, Any]:
    """The data of the TOML file at ``path`` ({} when missing).

    Raises:
        SettingError: the file cannot be read, is not valid TOML, or writes a table of the
            settings (``[sampling]``, ``[keys]``) as something else (a value, ``[[sampling]]``);
            the message names the file, the complaint (the parser's: line and column) and
            ``fix``, what to do about it (by default: edit the file or move it aside).
    """
    try:
        raw = path.read_bytes()
        raw = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw  # (an editor's BOM)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    fix = fix or "fix it in an editor (or move it aside to start over)"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SettingError(f"config file {path} is not valid TOML: not UTF-8 (byte "
                           f"0x{raw[exc.start]:02x} at line {line}, column {column}); "
                           f"{fix}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"config file {path} is not valid TOML: {exc}; {fix}") from None
    for table in (SAMPLING_TABLE, KEYS_TABLE):
        if table in data and not isinstance(data[table], dict):
            kind = {list: "an array", str: "a string", bool: "a boolean", int: "an integer",
                    float: "a number"}.get(type(data[table]), "a value")
            raise SettingError(f"config file {path}: {table} must be a table ([{table}]), not "
                               f"{kind}; {fix}")
    return data


def _flatten(data: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, value in data.items():
        if isinstance(value, dict):
            out += [(f"{name}.{k}", v) for k, v in value.items()]
        else:
            out.append((name, value))
    return out
