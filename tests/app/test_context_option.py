"""``--context N`` / ``-C``, ``context`` in config.toml and ``LOCALCHAT_CONTEXT`` (issue 18).

Precedence flag > environment > config file > default, as the other settings; the engine's KV
pool is sized from it; a value above the model's trained context is refused naming both
numbers (a usage error for the flag, a setting error, exit 1, for config.toml / the env); ``ask --json`` reports the value in use. The trained context is read independently
from the model file (``load_model_config``), never hard-coded.
"""

from __future__ import annotations

import json

import pytest

from localchat.app.cli_io import CliUsageError
from localchat.app.engine_loader import check_context, engine_config
from localchat.app.load_options import (
    LoadOptions,
    check_load_options,
    context_choice,
    typed_spelling,
)
from localchat.app.settings import SettingError, load_settings
from tests.app.test_cli import env, run  # noqa: F401 - the subprocess fixture

GREEDY = ["--temperature", "0", "--max-tokens", "4"]


def test_context_precedence_flag_env_config_default(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("context = 2048\n", encoding="utf-8")
    assert context_choice(None, load_settings(cfg, environ={})) == (2048,
                                                                   "context (config.toml)")
    from_env = load_settings(cfg, environ={"LOCALCHAT_CONTEXT": "3072"})
    assert context_choice(None, from_env) == (3072, "LOCALCHAT_CONTEXT")
    assert context_choice(1024, from_env) == (1024, "--context")
    assert context_choice(None, load_settings(tmp_path / "none.toml", environ={})) == (
        None, "context (config.toml)")


@pytest.mark.parametrize("argv,named", [
    (["ask", "-C", "512", "hi"], "-C"),
    (["ask", "-C512", "hi"], "-C"),
    (["serve", "--context=512"], "--context"),
    (["serve", "--max-model-len", "512"], "--max-model-len"),
    (["serve", "-C", "9", "--context", "512"], "--context"),  # the last one counts
    (["ask", "--", "-C"], "--max-model-len"),  # after --: the prompt, not a flag
    (["ask", "--continue", "hi"], "--max-model-len"),
])
def test_errors_name_the_context_flag_as_typed(argv, named):
    """A refused context names the spelling the user typed (serve's ``-C`` was reported as
    ``--max-model-len``); with none typed, the option's first spelling."""
    assert typed_spelling(("--max-model-len", "--context", "-C"), argv) == named


def test_bad_context_values_are_refused_with_where_they_came_from(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text("context = 0\n", encoding="utf-8")
    with pytest.raises(SettingError, match="context"):
        load_settings(cfg, environ={})
    with pytest.raises(SettingError, match="LOCALCHAT_CONTEXT"):
        load_settings(tmp_path / "none.toml", environ={"LOCALCHAT_CONTEXT": "lots"})
    with pytest.raises(CliUsageError, match="--context -5"):
        check_load_options(LoadOptions("m", context=-5))


def test_context_sizes_the_engine_config():
    config = engine_config(LoadOptions("m", context=1536), None)
    assert config.scheduler.max_model_len == 1536
    assert engine_config(LoadOptions("m"), None).scheduler.max_model_len is None


def test_context_above_the_trained_one_names_both_numbers(smollm2_gguf, cache_dir):
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.loader import load_model_config

    trained = load_model_config(smollm2_gguf, cache_dir).max_position_embeddings
    source = resolve_model(str(smollm2_gguf), cache_dir=cache_dir, download=False)
    check_context(LoadOptions(str(smollm2_gguf), context=trained), source)  # the limit is ok
    with pytest.raises(SettingError) as info:  # a bad setting: exit 1, as the README says
        check_context(LoadOptions(str(smollm2_gguf), context=trained + 1,
                                  context_origin="LOCALCHAT_CONTEXT"), source)
    msg = str(info.value)
    assert f"LOCALCHAT_CONTEXT {trained + 1}" in msg and f"{trained} tokens" in msg
    with pytest.raises(CliUsageError, match=f"--context {trained + 1}"):  # a bad flag: exit 2
        check_context(LoadOptions(str(smollm2_gguf), context=trained + 1,
                                  context_origin="--context"), source)


def test_engine_kv_pool_follows_the_context(smollm2_gguf, cache_dir):
    from localchat.engine.llm_engine import LLMEngine

    config = engine_config(LoadOptions(str(smollm2_gguf), quant="none", context=1024), None)
    engine = LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)
    try:
        assert engine.max_model_len == 1024
        pool = engine.num_blocks * engine.config.cache.block_size
        # Sized for max_num_seqs contexts of 1024 tokens (or fewer, capped by memory), never
        # less than one.
        assert 1024 <= pool <= 1024 * engine.config.scheduler.max_num_seqs
    finally:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


def test_ask_context_flag_env_and_refusal(env, smollm2_gguf, cache_dir):  # noqa: F811
    from localchat.engine.loader import load_model_config

    trained = load_model_config(smollm2_gguf, cache_dir).max_position_embeddings
    model = ["-m", str(smollm2_gguf), "--no-save", *GREEDY]
    r = run(env, "ask", *model, "-C", "768", "--json", "Hi")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["context"] == 768
    r = run({**env, "LOCALCHAT_CONTEXT": "640"}, "ask", *model, "--json", "Hi")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["context"] == 640
    r = run(env, "ask", *model, "--context", str(trained * 2), "Hi")
    err = r.stderr.decode()
    assert r.returncode == 2 and r.stdout == b""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(trained * 2) in err and str(trained) in err.replace(str(trained * 2), "")


def test_chat_jsonl_and_plan_take_the_context(env, smollm2_gguf, cache_dir):  # noqa: F811
    from localchat.engine.loader import load_model_config

    trained = load_model_config(smollm2_gguf, cache_dir).max_position_embeddings
    r = run(env, "chat", "--jsonl", "-m", str(smollm2_gguf), "-C", str(trained + 1),
            stdin=b'{"role": "user", "content": "hi"}\n')
    assert r.returncode == 2 and str(trained + 1) in r.stderr.decode()
    r = run(env, "plan", str(smollm2_gguf), "-C", str(trained + 1))
    err = r.stderr.decode()
    assert r.returncode == 2 and str(trained + 1) in err and f"{trained} tokens" in err
    r = run(env, "plan", str(smollm2_gguf), "-C", "1024", "--json")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["requested_context_len"] == 1024
    r = run({**env, "LOCALCHAT_CONTEXT": "1536"}, "plan", str(smollm2_gguf), "--json")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["requested_context_len"] == 1536


@pytest.mark.parametrize("tty, callback, want", [(True, False, True), (False, False, False),
                                                  (True, True, False)])
def test_repack_progress_only_on_a_terminal(monkeypatch, smollm2_gguf, tty, callback, want):
    # engine_loader.load asks for the first load's repack counter when its own lines go to a
    # terminal (stderr a tty, no progress callback such as the TUI's)
    from localchat.app import cli_io, engine_loader
    from localchat.engine.llm_engine import LLMEngine

    seen = []
    monkeypatch.setattr(cli_io, "stream_isatty", lambda stream: tty)
    monkeypatch.setattr(LLMEngine, "from_source",
                        classmethod(lambda cls, source, config, cache_dir=None:
                                    seen.append(config.quant.progress)))
    engine_loader.load(LoadOptions(str(smollm2_gguf)),
                       progress=(lambda line: None) if callback else None)
    assert seen == [want]
