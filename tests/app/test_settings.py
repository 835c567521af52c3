"""Paths (LOCALCHAT_HOME, XDG on Linux) and config.toml loading."""

from __future__ import annotations

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
    ],
)
def test_bad_config(tmp_path, text, words):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(LocalchatError) as err:
        settings.load_settings(cfg)
    assert words in str(err.value) and str(cfg) in str(err.value)
    assert "\n" not in str(err.value)
