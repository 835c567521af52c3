"""Flags that configure an in-process engine next to an endpoint, a k without a draft, and
how flags read in ``--help`` (no model is loaded and no server is reached here).

An endpoint answers with its own model and settings, so ``--draft``, ``--quant``,
``--num-speculative-tokens`` and ``--context`` cannot apply to it: a usage error naming the
flag (before, the endpoint answered and the flag was silently dropped)."""

from __future__ import annotations

import logging
import signal
import sys

import pytest

from localchat.app import ask_cmd, cli, interrupts
from localchat.app.engine_loader import engine_config
from localchat.app.load_options import LoadOptions

from .fake_engine import FakeEngine

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing may connect to it here


@pytest.fixture
def run_cmd(monkeypatch, capsys, tmp_path):
    """Run ``localchat ARGS`` in-process through ``cli.main`` (what the console script runs);
    returns (exit code, stdout, stderr, whether an engine was loaded)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALCHAT_ENDPOINT", raising=False)

    def go(args, env=None):
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        loaded = []
        monkeypatch.setattr(ask_cmd, "load_engine",
                            lambda options: loaded.append(options) or FakeEngine(["x"]))
        monkeypatch.setattr(sys, "stdin", None)
        # cli.main sets process-wide state meant for localchat's own process (the stop
        # signals' one-line handlers, the engine log lines): put pytest's back after it
        handlers = {sig: signal.getsignal(sig) for sig in interrupts.STOP_SIGNALS}
        log_handlers = list(logging.getLogger("localchat").handlers)
        try:
            with pytest.raises(SystemExit) as exit_info:
                cli.main(args)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            logging.getLogger("localchat").handlers[:] = log_handlers
        captured = capsys.readouterr()
        return exit_info.value.code, captured.out, captured.err, bool(loaded)

    return go


@pytest.mark.parametrize("flag", [["--quant", "int4"], ["--draft", "ngram"],
                                  ["--num-speculative-tokens", "2"], ["--context", "512"]])
def test_an_engine_flag_with_endpoint_is_a_usage_error_naming_it(run_cmd, flag):
    code, out, err, loaded = run_cmd(["ask", "--no-save", "--endpoint", UNREACHABLE, *flag, "hi"])
    assert (code, out, loaded) == (2, "", False)
    assert err == (f"localchat: error: {flag[0]} does not apply with --endpoint: the server at "
                   f"{UNREACHABLE} answers with its own model and settings\n")


def test_an_engine_flag_with_the_endpoint_setting_points_at_local(run_cmd):
    code, out, err, loaded = run_cmd(["ask", "--no-save", "--quant", "int8", "hi"],
                                     env={"LOCALCHAT_ENDPOINT": UNREACHABLE})
    assert (code, out, loaded) == (2, "", False)
    assert err.count("\n") == 1 and err.startswith("localchat: error: --quant does not apply to "
                                                   "the endpoint in the settings")
    assert err.rstrip().endswith("add --local to load the model here")
    code, out, err, loaded = run_cmd(["ask", "--no-save", "--local", "--quant", "int8", "hi"],
                                     env={"LOCALCHAT_ENDPOINT": UNREACHABLE})
    assert (code, out, err, loaded) == (0, "x\n", "", True)


def test_chat_jsonl_refuses_an_engine_flag_with_endpoint(run_cmd):
    code, out, err, loaded = run_cmd(["chat", "--jsonl", "--endpoint", UNREACHABLE, "--context",
                                      "256"])
    assert (code, out, loaded) == (2, "", False)
    assert err.startswith("localchat: error: --context does not apply with --endpoint")


def test_local_with_endpoint_keeps_its_own_message(run_cmd):
    code, _, err, loaded = run_cmd(["ask", "--local", "--endpoint", UNREACHABLE, "--quant",
                                    "int4", "hi"])
    assert (code, loaded) == (2, False)
    assert err == "localchat: error: use either --local or --endpoint, not both\n"


def test_engine_flags_lists_the_flags_given_in_order():
    args = ask_cmd.AskArgs(prompt="hi", context=0, quant="int4", draft="ngram")
    assert ask_cmd.engine_flags(args) == ["--draft", "--quant", "--context"]
    assert ask_cmd.engine_flags(ask_cmd.AskArgs(prompt="hi")) == []


def test_k_without_a_draft_says_it_does_nothing(capsys):
    config = engine_config(LoadOptions(model="m", num_speculative_tokens=3), None)
    assert config.speculative.draft_model is None
    assert capsys.readouterr().err == (
        "localchat: note: --num-speculative-tokens has no effect without a draft (--draft, or "
        "'draft' in the settings)\n")
    config = engine_config(LoadOptions(model="m", num_speculative_tokens=3), "/models/draft")
    assert config.speculative.num_speculative_tokens == 3
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("args", [["--help"], ["ask", "--help"], ["history", "list", "--help"],
                                  ["chat", "-h"]])
def test_help_shows_no_value_type_for_on_off_flags(run_cmd, monkeypatch, args):
    monkeypatch.setenv("COLUMNS", "120")
    code, out, err, _ = run_cmd(args)
    assert (code, err) == (0, "")
    assert "Show this message and exit." in out
    assert "<bool>" not in out
    if args == ["ask", "--help"]:  # value options keep their type
        assert "<int>" in out and "<float>" in out
        flag_rows = [line for line in out.splitlines() if "--no-save" in line]
        assert flag_rows and all("<" not in row for row in flag_rows), flag_rows

