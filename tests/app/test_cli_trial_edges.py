"""CLI edges of a second new-user trial: stdin that is a directory or cannot be read, an empty
conversation id for ``history``, ``config set``/``unset`` on a broken ``config.toml``, and
``ask --endpoint --json``'s ``context`` and ``memory`` (no model is loaded anywhere here)."""

from __future__ import annotations

import errno
import os
import sys

import pytest

from localchat.app import ask_cmd, cli, cli_io

from .fake_engine import FakeEngine
from .test_cli import assert_one_line_error, env, run  # noqa: F401 - the subprocess fixture

# -- stdin that is a directory or fails -------------------------------------------------------


class _FdStdin:
    """``sys.stdin`` over a raw file descriptor (its ``buffer`` is itself), as after
    ``localchat ask hi < FOLDER`` were the interpreter to start on it (CPython stops at its own
    startup; other launchers and interpreters may not)."""

    def __init__(self, fd: int, fail: OSError | None = None) -> None:
        self.fd, self.fail, self.buffer = fd, fail, self

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd

    def read(self, size: int = -1) -> bytes:
        if self.fail is not None:
            raise self.fail
        return os.read(self.fd, 1 << 20)


@pytest.fixture
def ask_with_stdin(monkeypatch, capsys, tmp_path):
    """Run ``ask ARGS`` in-process with ``sys.stdin`` set to a given object; returns (exit
    code, stdout, stderr, whether the engine was loaded)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))

    def go(args, stdin):
        loaded = []
        monkeypatch.setattr(ask_cmd, "load_engine",
                            lambda options: loaded.append(options) or FakeEngine(["x"]))
        monkeypatch.setattr(sys, "stdin", stdin)
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "--no-save", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err, bool(loaded)

    return go


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: error: "), err
    return lines[0]


def test_stdin_that_is_a_directory_is_a_usage_error_before_the_load(ask_with_stdin, tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        code, out, err, loaded = ask_with_stdin(["hi"], _FdStdin(fd))
        assert (code, out, loaded) == (2, "", False), err
        assert "stdin is a directory" in _one_error_line(err)
        # --no-stdin is the way out the message names
        code, out, err, loaded = ask_with_stdin(["hi", "--no-stdin"], _FdStdin(fd))
        assert (code, out, loaded) == (0, "x\n", True), err
    finally:
        os.close(fd)


def test_stdin_that_cannot_be_read_is_an_error_not_an_answer_without_it(ask_with_stdin):
    r, w = os.pipe()
    try:
        failing = _FdStdin(r, fail=OSError(errno.EIO, os.strerror(errno.EIO)))
        code, out, err, loaded = ask_with_stdin(["summarize"], failing)
        assert (code, out, loaded) == (1, "", False), err
        assert "cannot read stdin" in _one_error_line(err)
    finally:
        os.close(r)
        os.close(w)


# -- history: an empty conversation id --------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("show", ""), ("show", "  "), ("export", "", "--format", "json"), ("rm", ""),
    ("rm", "abc", ""), ("search", ""),
])
def test_history_empty_id_is_a_usage_error(env, args):  # noqa: F811
    r = run(env, "history", *args)
    line = assert_one_line_error(r, 2, f"history {args[0]}:")
    assert "(see 'localchat history list')" in line or args[0] == "search"
    # as a missing id is: one line, exit 2
    assert_one_line_error(run(env, "history", args[0]), 2)


# -- config set/unset on a config.toml that does not parse -------------------------------------


@pytest.fixture
def config_run(monkeypatch, capsys, tmp_path):
    """Run ``localchat ARGS`` in-process in a fresh LOCALCHAT_HOME, no LOCALCHAT_* settings;
    returns (exit code, stdout, stderr)."""
    from localchat.app import settings

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "lc"))
    for key in settings.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    monkeypatch.setattr(sys, "stdin", None)

    def go(*args):
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return go


BROKEN = b'# my settings\ntemperature = \n[sampling]\ntop_p = 0.9  # mine\n\xff\n'


@pytest.mark.parametrize("args", [("config", "set", "temperature", "0.2"),
                                  ("config", "unset", "temperature"),
                                  ("config", "set", "sampling.top_p", "0.8")])
def test_config_set_unset_refuse_a_broken_file_and_keep_it_byte_for_byte(config_run, args):
    from localchat.app import settings

    path = settings.config_path()
    path.write_bytes(BROKEN)
    code, out, err = config_run(*args)
    assert (code, out) == (1, ""), err
    line = _one_error_line(err)
    assert f"config file {path} is not valid TOML" in line
    assert "line 2" in line or "line 5" in line  # the parser's position
    assert "left unchanged: fix it in an editor" in line
    assert f"run 'localchat {args[0]} {args[1]}' again" in line
    assert path.read_bytes() == BROKEN
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no stray temp file


def test_a_broken_config_file_says_how_to_fix_it_everywhere(config_run):
    from localchat.app import settings

    path = settings.config_path()
    path.write_bytes(b"default_model = \n")
    for args in (("config", "show"), ("ask", "--no-save", "hi")):
        code, out, err = config_run(*args)
        assert (code, out) == (1, ""), err
        line = _one_error_line(err)
        assert f"config file {path} is not valid TOML" in line and "fix it in an editor" in line
    code, _, err = config_run("config", "path")  # still works: where to fix it
    assert code == 0 and err == ""
    path.write_text('default_model = "smollm2-135m"\n')  # fixed by hand: set works again
    assert config_run("config", "set", "temperature", "0.2")[0] == 0
    assert "temperature = 0.2" in path.read_text()


# -- an empty -m (a third trial: `-m "$MODEL"` with the variable unset) -------------------------


@pytest.mark.parametrize("args", [("ask", "-m", "", "hi"), ("ask", "-m", "  ", "hi"),
                                  ("serve", "-m", ""), ("chat", "--jsonl", "-m", "")],
                         ids=["ask", "ask-blank", "serve", "chat-jsonl"])
def test_an_empty_model_flag_is_a_usage_error_not_the_default_model(env, args):
    """``-m ""`` answered with the default model (``args.model or default``); ``plan ""`` and
    ``pull ""`` already refused an empty name."""
    proc = run(env, *args)
    assert_one_line_error(proc, 2, "-m/--model needs a model name")


@pytest.mark.parametrize("args", [("--draft", "ngram"), ("--num-speculative-tokens", "3"),
                                  ("--local",)], ids=["draft", "k", "local"])
def test_the_tui_refuses_the_flags_only_jsonl_uses(env, args):
    """``localchat chat --draft ngram`` opened the TUI without a draft and said nothing (a
    second trial); these flags are --jsonl's (the TUI's draft is set under Ctrl+S)."""
    proc = run(env, "chat", *args)
    assert_one_line_error(proc, 2, f"{args[0]} applies with --jsonl")
