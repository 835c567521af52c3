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
