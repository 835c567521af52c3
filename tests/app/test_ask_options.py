"""``ask``'s engine options in-process with a fake engine: --draft / --quant /
--num-speculative-tokens checked before anything loads (a draft that is the model, a bad
draft named by the flag or setting that gave it), what reaches the loader, and the precedence
of flags, environment and config file."""

from __future__ import annotations

import sys

import pytest

from localchat.app import cli, cli_io, settings

from .test_ask_features import ask, home  # noqa: F401 - fixtures


@pytest.mark.parametrize(("args", "needle"), [
    (["--quant", "int3"], "--quant int3"),
    (["--num-speculative-tokens", "0"], "--num-speculative-tokens 0"),
    (["--num-speculative-tokens", "17"], "--num-speculative-tokens 17"),
])
def test_bad_engine_options_are_usage_errors(ask, args, needle):
    code, out, err, _engine, options = ask(["hi", *args])
    assert code == 2 and out == "" and options is None
    assert err.startswith(f"localchat: error: {needle}")
    assert err.count("\n") == 1


def test_a_draft_that_is_the_model_is_a_bad_flag_value(home, tmp_path, capsys, monkeypatch):
    """``--draft`` naming the model itself (also through a symbolic link) is refused before
    anything loads: one line, exit 2 (a usage error, as ``--draft auto`` on a model with no
    catalog draft is in ``plan``)."""
    from tests.engine.tiny_models import save_tiny_model

    folder = tmp_path / "tiny"
    save_tiny_model("qwen2", folder)
    link = tmp_path / "link"
    link.symlink_to(folder)
    capsys.readouterr()  # the writer's progress bar
    monkeypatch.setattr(sys, "stdin", None)
    for draft in (folder, link):
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app),
                              ["ask", "hi", "--local", "-m", str(folder), "--draft", str(draft)])
        err = capsys.readouterr().err
        assert (code, err) == (2, (f"localchat: error: --draft {draft}: the draft is the "
                                   "model itself\n"))


def test_a_bad_draft_setting_names_the_setting_not_a_flag(home, tmp_path, capsys, monkeypatch):
    """A draft from config.toml or the environment is named as such (the user never typed
    ``--draft``) and is a bad setting, exit 1, as every bad setting is."""
    from localchat.app import settings
    from tests.engine.tiny_models import save_tiny_model

    folder = tmp_path / "tiny"
    save_tiny_model("qwen2", folder)
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", None)
    settings.config_path().write_text(f'draft = "{folder}"\n')

    def ask_here(*args):
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app),
                              ["ask", "hi", "--local", "--no-save", "-m", str(folder), *args])
        return code, capsys.readouterr().err

    said = f"localchat: error: draft (config.toml) {folder}: the draft is the model itself\n"
    assert ask_here() == (1, said)
    monkeypatch.setenv("LOCALCHAT_DRAFT", "auto")
    code, err = ask_here()
    assert (code, err.split(":")[:3]) == (1, ["localchat", " error", " LOCALCHAT_DRAFT auto"])
    code, err = ask_here("--draft", "auto")  # the flag wins, and is named: a usage error
    assert (code, err.split(":")[:3]) == (2, ["localchat", " error", " --draft auto"])
    # A draft that names no model says which setting (or flag) named it.
    missing = tmp_path / "absent.gguf"
    monkeypatch.setenv("LOCALCHAT_DRAFT", str(missing))
    code, err = ask_here()
    assert code == 1 and err.startswith("localchat: error: LOCALCHAT_DRAFT: ")
    assert str(missing) in err and err.count("\n") == 1
    code, err = ask_here("--draft", str(missing))
    assert code == 1 and err.startswith("localchat: error: --draft: ") and str(missing) in err


def test_draft_options_reach_the_loader(ask):
    code, _, _, _, options = ask(["hi", "--draft", "auto", "--num-speculative-tokens", "3",
                                  "--quant", "int8"])
    assert code == 0
    assert (options.draft, options.num_speculative_tokens, options.quant) == ("auto", 3, "int8")


def test_engine_options_reach_the_loader(ask):
    code, _, _, _, options = ask(["hi", "--quant", "none", "-m", "some-model"])
    assert code == 0 and (options.model, options.quant, options.draft) == (
        "some-model", "none", None)


def test_precedence_flag_over_env_over_config_over_default(ask, monkeypatch):
    from localchat.engine.hub.catalog import CATALOG

    _, _, _, engine, options = ask(["hi"])
    # No setting: the default model's recommendation (its catalog entry), not SamplingParams'.
    recommended = dict(CATALOG["smollm2-135m"].sampling)["temperature"]
    assert engine.sampling_params.temperature == recommended and options.model == "smollm2-135m"
    settings.set_value("temperature", "0.2")
    settings.set_value("default_model", "from-config")
    settings.set_value("system_prompt", "config system")
    _, _, _, engine, options = ask(["hi"])
    assert engine.sampling_params.temperature == 0.2 and options.model == "from-config"
    assert engine.tokenizer.messages[0] == {"role": "system", "content": "config system"}
    monkeypatch.setenv("LOCALCHAT_TEMPERATURE", "0.3")
    monkeypatch.setenv("LOCALCHAT_DEFAULT_MODEL", "from-env")
    _, _, _, engine, options = ask(["hi"])
    assert engine.sampling_params.temperature == 0.3 and options.model == "from-env"
    _, _, _, engine, options = ask(["hi", "--temperature", "0.4", "-m", "from-flag", "-s", "S"])
    assert engine.sampling_params.temperature == 0.4 and options.model == "from-flag"
    assert engine.tokenizer.messages[0] == {"role": "system", "content": "S"}
    monkeypatch.setenv("LOCALCHAT_QUANT", "int4")
    code, _, _, _, options = ask(["hi"])
    assert code == 0 and options.quant == "int4"
    code, _, _, _, options = ask(["hi", "--quant", "none"])
    assert code == 0 and options.quant == "none"


def test_bad_environment_value_names_the_variable(ask, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_TOP_P", "2")
    code, out, err, _, _ = ask(["hi"])
    assert code == 1 and out == ""
    assert err == ("localchat: error: environment variable LOCALCHAT_TOP_P: sampling.top_p "
                   "must be in (0, 1], got 2.0\n")
