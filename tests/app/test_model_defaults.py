"""Each model's recommended sampling as defaults below the user's settings (issue 18).

References: the catalog entry's recommendation (SmolLM2's model card: temperature 0.2, top-p
0.9), a ``generation_config.json`` written by the test, and ``SamplingParams``' own defaults
for fields nobody set.
"""

from __future__ import annotations

import json

from localchat.app import ask_cmd, cli, cli_io
from localchat.app.model_defaults import from_generation_config, recommended_sampling
from localchat.engine.hub.catalog import CATALOG
from localchat.engine.sampling_params import SamplingParams
from tests.app.fake_engine import FakeEngine
from tests.app.tui.conftest import wait_for
from tests.app.tui.fake_async_engine import GatedEngine


def test_catalog_recommendation_for_smollm2():
    values, origin = recommended_sampling("smollm2-135m")
    assert values == {"temperature": 0.2, "top_p": 0.9} == dict(CATALOG["smollm2-135m"].sampling)
    assert origin == "catalog smollm2-135m"
    assert recommended_sampling("no/such-model-anywhere") == ({}, None)


def test_generation_config_of_an_hf_folder(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
         "repetition_penalty": 1.1, "max_length": 100, "bos_token_id": 1}), encoding="utf-8")
    assert from_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                "repetition_penalty": 1.1}
    (tmp_path / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.9}')
    assert from_generation_config(tmp_path) == {"temperature": 0.0}  # transformers: greedy
    (tmp_path / "generation_config.json").write_text('{"top_p": 7, "temperature": 0.3}')
    assert from_generation_config(tmp_path) == {"temperature": 0.3}  # out of range: dropped
    (tmp_path / "generation_config.json").write_text("not json")
    assert from_generation_config(tmp_path) == {}


def _ask(monkeypatch, capsys, args, environ=()):
    engine = FakeEngine(["ok"])
    monkeypatch.setattr(ask_cmd, "load_engine", lambda options: engine)
    monkeypatch.setattr("sys.stdin", None)
    for k, v in environ:
        monkeypatch.setenv(k, v)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "--no-save", *args])
    out = capsys.readouterr().out
    return code, engine.sampling_params, out


def test_ask_uses_the_model_defaults_below_the_users_settings(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    base = SamplingParams()
    code, sp, out = _ask(monkeypatch, capsys, ["--json", "hi"])
    assert code == 0 and (sp.temperature, sp.top_p) == (0.2, 0.9)
    assert sp.top_k == base.top_k and sp.max_tokens == base.max_tokens
    assert json.loads(out)["sampling"]["temperature"] == 0.2
    code, sp, _ = _ask(monkeypatch, capsys, ["hi"], [("LOCALCHAT_TEMPERATURE", "0.5")])
    assert (sp.temperature, sp.top_p) == (0.5, 0.9)  # the environment wins over the model
    code, sp, _ = _ask(monkeypatch, capsys, ["--temperature", "0.1", "hi"],
                       [("LOCALCHAT_TEMPERATURE", "0.5")])
    assert sp.temperature == 0.1  # the flag wins over everything


def test_config_show_names_the_models_recommendation(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALCHAT_TOP_P", "0.8")
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["config", "show"])
    out = capsys.readouterr().out
    assert code == 0
    lines = {line.split(" ")[0]: line for line in out.splitlines()}
    assert lines["sampling.temperature"].startswith("sampling.temperature = 0.2  # model "
                                                    "smollm2-135m (catalog smollm2-135m)")
    assert lines["sampling.top_p"] == "sampling.top_p = 0.8  # environment LOCALCHAT_TOP_P"


async def test_tui_uses_the_loaded_models_defaults(tmp_path, monkeypatch):
    from localchat.app.settings import Settings
    from localchat.app.tui.app import ChatApp
    from localchat.app.tui.history import TuiStore
    from localchat.app.tui.widgets.prompt_input import PromptInput

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    engine = GatedEngine([["ok"]], gated=False)
    app = ChatApp(model="smollm2-135m", settings=Settings(sampling={"max_tokens": 64}),
                  engine_loader=lambda spec, **kw: engine, store=TuiStore(":memory:"),
                  remember_theme=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.engine is engine, what="the load")
        assert app.sampling_defaults()["temperature"] == 0.2
        prompt = app.screen.query_one(PromptInput)
        await wait_for(pilot, lambda: prompt.border_subtitle == "temp 0.2 · top-p 0.9 · max 64")
        prompt.focus()
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: engine.calls, what="the request")
        sp = engine.calls[0]["sampling"]
        assert (sp.temperature, sp.top_p, sp.max_tokens) == (0.2, 0.9, 64)
