"""``cli_coerce``: the pydantic-free converter gives typer's own values and errors.

The reference is typer's converter for the same parameter of the real command tree (built
the way typer builds it, through pydantic); every input is run through both.
"""

from __future__ import annotations

import pytest
import typer

from localchat.app import cli, cli_coerce, cli_io

INPUTS = {
    int: ["16", "-3", "0", "007", "+5", "1.5", " 4", "4 ", "1e3", "abc", "", "1_000",
          "\u0661\u0662", 16, True],
    float: ["0", "0.7", "-1.5", "1.", "100", "1e-1", "inf", "nan", ".5", "abc", "", "1,5",
            0.25, 3],
    str: ["hi", "", "-x", " spaced "],
    bool: [True, False, "true", "0"],
    list[str]: [("a", "b"), ["x"], ()],
}


def _params():
    """(kind, parameter) for one parameter of each kind in the real command tree."""
    command = typer.main.get_command(cli.app)
    found = {}

    def walk(cmd):
        for param in cmd.params:
            kind = cli_coerce._kind(getattr(param.type_descriptor, "annotation", None))
            if kind is not None and kind not in found and cli_coerce._install_param(param):
                found[kind] = param
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(command)
    return found


def _outcome(runtime, value, param):
    try:
        result = runtime.coerce(value, param=param, ctx=None)
    except Exception as exc:  # noqa: BLE001 - the error type and message are compared
        return ("error", type(exc).__name__, str(exc))
    return ("value", type(result).__name__, repr(result))  # repr: nan equals nan


def test_every_kind_is_found_in_the_command_tree():
    assert set(_params()) == set(INPUTS)


@pytest.mark.parametrize("kind", list(INPUTS), ids=lambda k: getattr(k, "__name__", str(k)))
def test_fast_conversion_equals_typers(kind):
    from typer._coercion import build_runtime_param

    param = _params()[kind]
    fast = param._runtime_param
    assert isinstance(fast, cli_coerce.FastRuntimeParam)
    reference = build_runtime_param(param.type_descriptor)
    for value in [*INPUTS[kind], None]:
        assert _outcome(fast, value, param) == _outcome(reference, value, param), value


def test_ask_parses_to_the_same_arguments_with_and_without(monkeypatch):
    """The whole ``ask`` command line through ``main``'s command (with ``install``) and
    through a command typer built alone: the same ``AskArgs``."""
    from localchat.app import ask_cmd

    seen = []
    monkeypatch.setattr(ask_cmd, "run_ask", seen.append)
    argv = ["ask", "-m", "smollm2-135m", "--temperature", "0.2", "--max-tokens", "16",
            "--top-k", "40", "--seed", "7", "--stop", "END", "--stop", "##", "--no-save",
            "--json", "-C", "1024", "hi there"]
    plain = typer.main.get_command(cli.app)
    assert cli_io.run_cli(plain, argv) == 0
    fast = typer.main.get_command(cli.app)
    assert cli_coerce.install(fast) > 20
    assert cli_io.run_cli(fast, argv) == 0
    assert seen[0] == seen[1]
    assert seen[1].sampling["stop"] == ("END", "##") and seen[1].sampling["max_tokens"] == 16
    # a value only typer accepts goes to typer, and a bad one gets typer's error
    assert cli_io.run_cli(fast, [*argv[:-1], "--temperature", "1e-1", "x"]) == 0
    assert seen[2].sampling["temperature"] == 0.1
    assert cli_io.run_cli(fast, ["ask", "--max-tokens", "many", "x"]) == 2
