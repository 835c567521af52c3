"""CLI edges a new user's trial found: values that start with "-" in ``config set``, a
command group's help printed once, and a context setting above the model's trained one
(a bad setting: exit 1)."""

from __future__ import annotations

import pytest

from tests.app.test_cli import env, run  # noqa: F401 - the subprocess fixture


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("presence_penalty", "-0.5", "sampling.presence_penalty = -0.5"),
    ("system_prompt", "-be brief", 'system_prompt = "-be brief"'),
])
def test_config_set_takes_values_that_start_with_a_dash(env, key, value, shown):  # noqa: F811
    r = run(env, "config", "set", key, value)
    assert r.returncode == 0, r.stderr
    assert shown in run(env, "config", "show").stdout.decode()
    assert run(env, "config", "unset", key).returncode == 0
    r = run(env, "config", "set", "presence_penalty", "--bogus")  # still checked as a value
    assert r.returncode == 2 and b"must be a number" in r.stderr


@pytest.mark.parametrize("group", ["config", "history"])
def test_a_group_without_a_command_prints_its_help_once(env, group):  # noqa: F811
    r = run(env, group)
    assert r.returncode == 0
    assert r.stdout.decode().count("Usage:") == 1, r.stdout.decode()


def test_context_setting_above_the_trained_context_is_a_setting_error(env):  # noqa: F811
    r = run({**env, "LOCALCHAT_CONTEXT": "99999999"}, "ask", "--no-save", "hi")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "LOCALCHAT_CONTEXT 99999999" in lines[0], lines


def test_version(env):  # noqa: F811
    from importlib.metadata import version

    r = run(env, "--version")
    assert r.returncode == 0 and r.stdout.decode().strip() == f"localchat {version('localchat')}"
