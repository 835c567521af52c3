"""A typo in a ``LOCALCHAT_CPU_*`` setting is the user's, not an internal error: ``ask`` says
what is wrong in one line on stderr and exits 2, as for a bad flag value (a trial found
``LOCALCHAT_CPU_ISA=bogus`` reported as ``internal error: ValueError(...)``)."""

from __future__ import annotations

import sys

from localchat.app import ask_cmd, cli, cli_io


def test_an_unknown_isa_setting_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    from localchat.kernels import cpu

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(cpu.ISA_ENV, "bogus")  # re-read at once (tests/conftest.py)

    def load_engine(options):  # where a real load first asks which ISA path to take
        cpu.active_isa()
        raise AssertionError("the setting was accepted")

    monkeypatch.setattr(ask_cmd, "load_engine", load_engine)
    monkeypatch.setattr(sys, "stdin", None)
    capsys.readouterr()
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi", "--no-save"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("localchat: error: LOCALCHAT_CPU_ISA='bogus' is not a setting: expected "
                   "one of scalar, avx2, avx512 (or unset)\n")


def test_a_bad_kv_cache_dtype_setting_is_one_line(monkeypatch, capsys, tmp_path):
    """``LOCALCHAT_KV_CACHE_DTYPE`` is read with the other settings: an unknown type is one
    line naming the variable (exit 1, as every bad setting), before any model loads."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALCHAT_KV_CACHE_DTYPE", "q8_0")
    monkeypatch.setattr(sys, "stdin", None)
    capsys.readouterr()
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi", "--no-save"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == ("localchat: error: environment variable LOCALCHAT_KV_CACHE_DTYPE: "
                   "kv_cache_dtype must be one of auto, float32, float16, bfloat16, got "
                   "'q8_0'\n")


def test_a_kv_cache_dtype_the_engine_cannot_read_is_refused(monkeypatch):
    """A 16-bit cache under a 16-bit engine of another type (or on CUDA) is refused by
    ``engine_config`` with the setting named, not deep in the load."""
    import pytest
    import torch

    from localchat.app import engine_loader
    from localchat.app.load_options import LoadOptions
    from localchat.app.settings import SettingError
    from localchat.engine.config import EngineConfig

    monkeypatch.setenv("LOCALCHAT_KV_CACHE_DTYPE", "float16")
    monkeypatch.setattr(EngineConfig, "resolved_dtype", lambda self: torch.bfloat16)
    with pytest.raises(SettingError, match="the kv_cache_dtype setting: kv_cache_dtype "
                                           "float16 needs a CPU engine computing in float32"):
        engine_loader.engine_config(LoadOptions(model="smollm2-135m"), None)
    monkeypatch.setenv("LOCALCHAT_KV_CACHE_DTYPE", "bfloat16")
    assert engine_loader.engine_config(LoadOptions(model="smollm2-135m"),
                                       None).cache.kv_cache_dtype == "bfloat16"
