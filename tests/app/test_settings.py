"""Paths (LOCALCHAT_HOME, XDG on Linux) and config.toml loading."""

from __future__ import annotations

import os
import sys

import pytest

from localchat.app import settings
from localchat.engine.errors import LocalchatError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "lc"))
    return tmp_path / "lc"


def test_localchat_home_overrides_all(home):
    assert settings.cache_dir() == home / "cache"
    assert settings.data_dir() == home / "data"
    assert settings.config_dir() == home / "config"
    assert all((home / k).is_dir() for k in ("cache", "data", "config"))
    assert settings.config_path() == home / "config" / "config.toml"


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_the_folders_are_private_whatever_the_umask(home):
    """Under ``umask 000`` the conversations', config's and cache's folders (the cache holds
    the kernel library localchat loads) and a new LOCALCHAT_HOME are still 0700."""
    old = os.umask(0)
    try:
        dirs = {k: getattr(settings, f"{k}_dir")() for k in ("data", "config", "cache")}
    finally:
        os.umask(old)
    modes = {k: d.stat().st_mode & 0o777 for k, d in {**dirs, "home": home}.items()}
    assert modes == {"data": 0o700, "config": 0o700, "cache": 0o700, "home": 0o700}


def test_a_byte_order_mark_before_the_config_is_read_past(home):
    """Windows editors may write a UTF-8 BOM first; the file reads as without it, and a bad
    byte later is still placed on its own line and column."""
    cfg = settings.config_dir() / "config.toml"
    cfg.write_bytes(b'\xef\xbb\xbfdefault_model = "m"\n[sampling]\ntop_p = 0.5\n')
    loaded = settings.load_settings()
    assert loaded.default_model == "m" and loaded.sampling["top_p"] == 0.5
    cfg.write_bytes(b'\xef\xbb\xbfdefault_model = "m"\nx = "\xff"\n')
    with pytest.raises(LocalchatError, match=r"byte 0xff at line 2, column 6"):
        settings.load_settings()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG layout is Linux's")
def test_xdg_dirs_without_home(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCALCHAT_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xf"))
    assert settings.cache_dir() == tmp_path / "xc" / "localchat"
    assert settings.data_dir() == tmp_path / "xd" / "localchat"
    assert settings.config_dir() == tmp_path / "xf" / "localchat"
    assert (tmp_path / "xc" / "localchat").is_dir()


def test_defaults_without_config(home):
    assert settings.load_settings() == settings.Settings(default_model="smollm2-135m")


def test_default_model_from_config(home):
    cfg = settings.config_dir() / "config.toml"
    cfg.write_text('# mine\ndefault_model = "qwen2.5-coder-1.5b"\nunknown_key = 3\n')
    assert settings.load_settings().default_model == "qwen2.5-coder-1.5b"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("default_model = ", "not valid TOML"),
        ("default_model = 3", "must be a non-empty string"),
        ('default_model = "  "', "must be a non-empty string"),
        # accepted before, then every ask failed with "cannot reach notaurl/v1"
        ('endpoint = "notaurl"', "endpoint must be an http:// or https:// URL"),
        ('endpoint = "ftp://host"', "endpoint must be an http:// or https:// URL"),
        ('endpoint = "http://[::1"', "endpoint must be an http:// or https:// URL"),
        # accepted before, then every ask --endpoint was an internal error (httpx sends
        # ASCII headers only); the key itself is never in the message
        ('api_key = "cl\u00e9"', "api_key must be printable ASCII without spaces"),
        ('api_key = "two words"', "api_key must be printable ASCII without spaces"),
    ],
)
def test_bad_config(tmp_path, text, words):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text, encoding="utf-8")
    with pytest.raises(LocalchatError) as err:
        settings.load_settings(cfg)
    assert words in str(err.value) and str(cfg) in str(err.value)
    assert "\n" not in str(err.value) and "cl\u00e9" not in str(err.value)


def test_localchat_home_naming_a_file_is_one_line_naming_it(tmp_path):
    import subprocess
    import sys

    home = tmp_path / "home-file"
    home.write_text("not a folder")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    for args in (["ask", "hi"], ["history", "list"], ["config", "show"],
                 ["config", "set", "temperature", "0.5"], ["models"]):
        proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", *args],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              timeout=120, check=False)
        err = proc.stderr.decode()
        assert proc.returncode == 1 and proc.stdout == b"", (args, err)
        assert err == f"localchat: error: LOCALCHAT_HOME={home}: {home} is a file, not a " \
                      "folder\n", args


def test_read_only_home_and_read_only_config_file_name_the_path(tmp_path, monkeypatch):
    import errno
    import tempfile
    from pathlib import Path

    from localchat.app import settings

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", read_only)
        with pytest.raises(settings.SettingError) as info:
            settings.data_dir()
    assert str(info.value) == (f"LOCALCHAT_HOME={tmp_path / 'home'}: cannot create the folder "
                               f"{tmp_path / 'home' / 'data'}: Read-only file system")

    def no_temp_file(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    path = settings.config_path()
    path.write_text('theme = "dark"\n')
    monkeypatch.setattr(tempfile, "mkstemp", no_temp_file)
    with pytest.raises(settings.SettingError) as info:
        settings.set_value("temperature", "0.5")
    assert str(info.value) == f"cannot write config file {path}: Read-only file system"
    assert path.read_text() == 'theme = "dark"\n'


def test_endpoint_setting_takes_http_urls_from_every_source(home, monkeypatch):
    key = settings.KEYS["endpoint"]
    assert settings.parse_value(key, " HTTPS://gpu-box:8000/v1 ") == "HTTPS://gpu-box:8000/v1"
    with pytest.raises(settings.SettingError, match="got 'gpu-box:8000'"):
        settings.parse_value(key, "gpu-box:8000")
    monkeypatch.setenv("LOCALCHAT_ENDPOINT", "notaurl")
    with pytest.raises(LocalchatError, match="LOCALCHAT_ENDPOINT: endpoint must be an http"):
        settings.load_settings()
