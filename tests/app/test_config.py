"""Settings keys, environment overrides, the comment-keeping TOML edit and ``localchat config``
(in-process through the real entry point; stdout and stderr checked apart)."""

from __future__ import annotations

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from localchat.app import cli, cli_io, settings, toml_edit


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "lc"))
    for key in settings.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    return tmp_path / "lc"


@pytest.fixture
def run(home, capsys):
    def go(*args):
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


def test_set_keeps_comments_and_other_keys(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('# my settings\ndefault_model = "a"  # mine\n\n[sampling]\n# cool\n'
                    'temperature = 0.5\n\n[other]\nx = 1\n')
    toml_edit.set_key(path, None, "theme", 'dark "blue"\\')
    toml_edit.set_key(path, "sampling", "temperature", 0.25)
    toml_edit.set_key(path, "sampling", "top_k", 40)
    toml_edit.set_key(path, None, "default_model", "b")
    text = path.read_text()
    assert text.startswith("# my settings\n") and "# cool\n" in text and "[other]\nx = 1" in text
    assert 'default_model = "b"  # mine\n' in text  # the edited line keeps its comment
    assert tomllib.loads(text) == {"default_model": "b", "theme": 'dark "blue"\\',
                                   "sampling": {"temperature": 0.25, "top_k": 40},
                                   "other": {"x": 1}}
    toml_edit.set_key(path, "sampling", "temperature", None)
    toml_edit.set_key(path, "sampling", "top_k", None)
    text = path.read_text()  # the emptied table's header and comment stay
    assert text.startswith("# my settings\n") and "[sampling]\n# cool\n" in text
    assert tomllib.loads(text) == {"default_model": "b", "theme": 'dark "blue"\\',
                                   "sampling": {}, "other": {"x": 1}}


@pytest.mark.parametrize(("text", "after_set", "after_unset"), [
    ("# mine\ntheme = 'x'  # t\nsampling.top_p = 0.8  # p\n[other]\nx = 1\n",
     ("# mine\ntheme = 'x'  # t\nsampling.top_p = 0.8  # p\nsampling.temperature = 0.25\n"
      "[other]\nx = 1\n"),
     "# mine\ntheme = 'x'  # t\nsampling.top_p = 0.8  # p\n[other]\nx = 1\n"),
    ("# mine\nsampling = { top_p = 0.8 }  # inline\n",
     "# mine\nsampling = { top_p = 0.8, temperature = 0.25 }  # inline\n",
     "# mine\nsampling = { top_p = 0.8 }  # inline\n"),
    ('# mine\nsystem_prompt = """a\nb"""  # multi\ntheme = "x"\n',
     ('# mine\nsystem_prompt = """a\nb"""  # multi\ntheme = "x"\n\n[sampling]\n'
      'temperature = 0.25\n'), None),
])
def test_dotted_inline_and_multiline_forms_are_edited_in_place(tmp_path, text, after_set,
                                                                after_unset):
    """A table written as dotted keys or as a one-line inline table, and a multi-line value,
    are edited where they are: comments stay (a helper's trial lost them to a rewrite)."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    toml_edit.set_key(path, "sampling", "temperature", 0.25)
    assert path.read_text() == after_set
    toml_edit.set_key(path, "sampling", "temperature", None)
    if after_unset is not None:
        assert path.read_text() == after_unset
    toml_edit.set_key(path, None, "system_prompt", "c")
    toml_edit.set_key(path, None, "system_prompt", None)
    assert path.read_text().startswith("# mine\n")
    assert "system_prompt" not in tomllib.loads(path.read_text())


def test_an_edit_that_would_lose_comments_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text("# mine\ntheme = 'x'\n")
    monkeypatch.setattr(toml_edit, "_edit_lines", lambda *a: None)  # no line edit found
    with pytest.raises(toml_edit.CannotEdit):
        toml_edit.set_key(path, None, "theme", "y")
    assert path.read_text() == "# mine\ntheme = 'x'\n"
    path.write_text("theme = 'x'\n")  # no comment: the whole rewrite goes ahead
    toml_edit.set_key(path, None, "theme", "y")
    assert tomllib.loads(path.read_text()) == {"theme": "y"}


def test_a_hash_inside_a_string_is_not_a_comment(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('system_prompt = "use # for headings"\ntheme = "x#y"   # mine\n')
    toml_edit.set_key(path, None, "system_prompt", "be brief")
    toml_edit.set_key(path, None, "theme", "dark")
    assert path.read_text() == 'system_prompt = "be brief"\ntheme = "dark"   # mine\n'


@pytest.mark.parametrize("text", [
    "sampling.temperature = 0.5\n",  # a dotted key: the line edit cannot find it
    'default_model = """a\nb"""\n',  # a multi-line value
    "",
])
def test_set_falls_back_to_a_whole_rewrite_when_a_line_edit_is_wrong(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    before = tomllib.loads(text)
    toml_edit.set_key(path, "sampling", "temperature", 0.75)
    toml_edit.set_key(path, None, "default_model", "q\x7f\u00e9\n")
    before.setdefault("sampling", {})["temperature"] = 0.75
    before["default_model"] = "q\x7f\u00e9\n"
    assert tomllib.loads(path.read_text()) == before


@pytest.mark.parametrize(("name", "raw", "value"), [
    ("temperature", "0", 0.0), ("sampling.top_p", "0.9", 0.9), ("top_k", " 40 ", 40),
    ("max_tokens", "64", 64), ("seed", "7", 7), ("quant", "int4", "int4"),
    ("default_model", " qwen2.5-coder-1.5b ", "qwen2.5-coder-1.5b"), ("theme", "light", "light"),
])
def test_parse_value_accepts(name, raw, value):
    assert settings.parse_value(settings.lookup_key(name), raw) == value


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("temperature", "hot", "sampling.temperature must be a number, got 'hot'"),
    ("temperature", "-1", "sampling.temperature must be in [0, 100], got -1.0"),
    ("top_k", "1.5", "sampling.top_k must be an integer"),
    ("top_k", "99999999999999999999", "sampling.top_k must be in [0, 2147483647]"),
    ("max_tokens", "0", "sampling.max_tokens must be >= 1"),
    ("quant", "int3", "quant must be one of auto, native, none, fp8, int8, int4, got 'int3'"),
    ("default_model", " ", "default_model must be a non-empty string"),
])
def test_parse_value_rejects_naming_the_key(name, raw, message):
    with pytest.raises(settings.SettingError) as err:
        settings.parse_value(settings.lookup_key(name), raw)
    assert str(err.value).startswith(message)


def test_config_file_values_are_checked(home):
    settings.config_path().write_text("[sampling]\ntop_k = 2.5\n")
    with pytest.raises(settings.SettingError, match=r"config file .*: sampling.top_k must be"):
        settings.load_settings()
    settings.config_path().write_text("[sampling]\ntemperature = true\n")
    with pytest.raises(settings.SettingError, match="sampling.temperature must be a number"):
        settings.load_settings()


def test_environment_over_config_file(home):
    settings.config_path().write_text('quant = "int8"\n[sampling]\ntemperature = 0.1\nfoo = 1\n')
    s = settings.load_settings(environ={"LOCALCHAT_TEMPERATURE": "0.9", "LOCALCHAT_QUANT": ""})
    assert (s.sampling, s.quant) == ({"temperature": 0.9}, "int8")
    assert s.sources == {"quant": "config", "sampling.temperature": "env"}
    assert s.unknown_keys == ("sampling.foo",)


def test_config_command_path_set_show_unset(run, home):
    code, out, err = run("config", "path")
    assert (code, out, err) == (0, f"{home / 'config' / 'config.toml'}\n", "")
    code, out, err = run("config", "set", "temperature", "0.2")
    assert (code, out) == (0, "") and err.startswith("localchat: note: sampling.temperature = 0.2")
    run("config", "set", "default_model", "qwen2.5-coder-0.5b")
    code, out, err = run("config", "show")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert 'default_model = "qwen2.5-coder-0.5b"  # config file' in lines
    assert "sampling.temperature = 0.2  # config file" in lines
    assert any(line.startswith("# sampling.top_p: default 1.0") for line in lines)
    assert "\x1b" not in out
    assert tomllib.loads(settings.config_path().read_text()) == {
        "default_model": "qwen2.5-coder-0.5b", "sampling": {"temperature": 0.2}}
    code, _, err = run("config", "unset", "temperature")
    assert code == 0 and settings.load_settings().sampling == {}
    assert err.startswith("localchat: note: sampling.temperature removed in ")
    # A key the file does not set is not said to be removed.
    code, _, err = run("config", "unset", "temperature")
    assert code == 0 and "sampling.temperature is not set in " in err and "removed" not in err


def test_config_get_prints_the_value_in_effect(run, home, monkeypatch):
    """``config get KEY`` (git's and llm's verb, missing before): the value ``config show``
    finds, bare, for scripts; an unset key with no default is exit 1 with a note; an unknown
    key exit 2."""
    run("config", "set", "default_model", "qwen2.5-coder-0.5b")
    assert run("config", "get", "default_model") == (0, "qwen2.5-coder-0.5b\n", "")
    assert run("config", "get", "sampling.top_p")[:2] == (0, "1.0\n")  # the default
    monkeypatch.setenv("LOCALCHAT_TEMPERATURE", "0.7")
    assert run("config", "get", "temperature")[:2] == (0, "0.7\n")  # the environment
    assert run("config", "get", "api_key") == (1, "", "localchat: note: api_key is not set\n")
    code, out, err = run("config", "get", "nosuch")
    assert (code, out) == (2, "") and "unknown config key 'nosuch'" in err


def test_config_show_names_the_environment(run, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_TOP_K", "5")
    code, out, _ = run("config", "show")
    assert code == 0 and "sampling.top_k = 5  # environment LOCALCHAT_TOP_K" in out.splitlines()


@pytest.mark.parametrize(("args", "needle"), [
    (["config", "set", "colour", "red"], "unknown config key 'colour'"),
    (["config", "set", "top_p", "2"], "sampling.top_p must be in (0, 1]"),
    (["config", "set", "quant", "int2"], "quant must be one of"),
    (["config", "set", "context", "1"], "context 1: the context must hold at least 2 tokens"),
    (["config", "unset", "nope"], "unknown config key 'nope'"),
    (["config", "set", "temperature"], "Missing argument"),
])
def test_config_set_errors_are_one_line_usage_errors(run, args, needle):
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert err.startswith("localchat: error: ") and err.count("\n") == 1 and needle in err
    assert not settings.config_path().exists()


def test_broken_config_file_is_a_runtime_error(run):
    settings.config_path().write_text("default_model = \n")
    code, out, err = run("config", "set", "temperature", "0.1")
    assert code == 1 and out == "" and "is not valid TOML" in err and err.count("\n") == 1
    assert settings.config_path().read_text() == "default_model = \n"


@pytest.mark.parametrize(("text", "needle"), [
    ("[[sampling]]\ntemperature = 0.3\n", "sampling must be a table ([sampling]), not an array"),
    ('sampling = "x"\n', "sampling must be a table ([sampling]), not a string"),
    ("keys = 3\n", "keys must be a table ([keys]), not an integer"),
])
def test_a_settings_table_written_as_something_else_is_one_line(run, text, needle):
    """(A trial's ``[[sampling]]`` gave ``config set`` an internal error, and ``ask`` an
    "unknown key 'sampling'" warning.)"""
    settings.config_path().write_text(text)
    for args in (["config", "set", "temperature", "0.1"], ["config", "show"]):
        code, out, err = run(*args)
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert f"config file {settings.config_path()}: {needle}; " in err
    assert settings.config_path().read_text() == text
    settings.config_path().write_text("[keys]\nstop = 5\n")
    code, _, err = run("config", "show")
    assert code == 1 and "keys.stop must be a string of keys" in err and "unknown" not in err


@pytest.mark.parametrize(("args", "needle"), [
    (["config", "set", "default_model", "nosuchmodel"], "not a catalog alias"),
    (["config", "set", "theme", "nosuchtheme"], "no such theme"),
    (["config", "set", "draft", "foo"], "not auto, ngram, none, a catalog alias"),
])
def test_config_set_refuses_a_model_or_theme_that_names_nothing(run, args, needle):
    code, out, err = run(*args)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err
    assert str(settings.config_path()) in err and not settings.config_path().exists()


@pytest.mark.parametrize("value", ["smollm2-135m", "Qwen/Qwen2.5-0.5B-Instruct", "light",
                                   "high-contrast", "nord"])
def test_config_set_accepts_aliases_repo_ids_and_themes(run, value):
    key = "default_model" if "-" in value and value[0] in "sQ" else "theme"
    code, _, err = run("config", "set", key, value)
    assert code == 0, err


@pytest.mark.parametrize("value", [
    "bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M", "hf.co/org/name:q8_0",
    "org/name@main:sub/model-Q5_K_M.gguf",
    "https://huggingface.co/org/name/blob/main/model-Q4_0.gguf"])
def test_config_set_accepts_a_gguf_file_of_a_hub_repo(run, value):
    """What ``ask -m`` and ``pull`` take (``engine/hub/hub_gguf.py``), the settings take."""
    for key in ("default_model", "draft"):
        code, _, err = run("config", "set", key, value)
        assert code == 0, err
    assert settings.load_settings(environ={}).default_model == value
    code, _, err = run("config", "set", "default_model", "org/name:")  # (no tag: refused)
    assert code == 2 and "not a catalog alias" in err


@pytest.mark.parametrize("value", ["auto", "ngram", "none", "off", "qwen2.5-coder-0.5b",
                                   "org/draft-model"])
def test_config_set_accepts_every_kind_of_draft(run, value):
    code, _, err = run("config", "set", "draft", value)
    assert code == 0, err
    assert settings.load_settings(environ={}).draft == value


def test_bad_default_model_from_the_config_file_is_named_at_ask_time(home):
    import os
    import subprocess
    import sys

    settings.config_path().write_text('default_model = "nosuchmodel"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "ask", "hi"],
                          stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=120,
                          check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and proc.stdout == b"" and err.count("\n") == 1
    assert err.startswith(f"localchat: error: default_model (from config file "
                          f"{settings.config_path()}): 'nosuchmodel' is not a model alias")


def test_a_relative_model_path_is_written_absolute(run, tmp_path, monkeypatch):
    """``./x.gguf`` set from one folder names the same file from every other (as ``ask -m``'s
    history does); aliases, special draft words and ``~`` paths are written as given."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x.gguf").write_bytes(b"GGUF")
    (tmp_path / "ngram").write_bytes(b"")  # a file named like a draft word stays a word
    monkeypatch.chdir(tmp_path)
    for key, value, written in (("default_model", "./models/x.gguf",
                                 str(tmp_path / "models" / "x.gguf")),
                                ("draft", "models/x.gguf", str(tmp_path / "models" / "x.gguf")),
                                ("draft", "ngram", "ngram"),
                                ("default_model", "smollm2-135m", "smollm2-135m")):
        code, _, err = run("config", "set", key, value)
        assert code == 0, err
        assert tomllib.loads(settings.config_path().read_text())[key] == written


def test_a_key_or_header_inside_a_multiline_string_is_not_edited(tmp_path):
    """(A trial's file: the edit took the ``default_model =`` inside the string for the key,
    then the whole-file rewrite dropped the comment after the string.)"""
    path = tmp_path / "config.toml"
    text = ('default_model = "a"\nsystem_prompt = """\ndefault_model = "x"\n[sampling]\n'
            '"""  # mine\n')
    path.write_text(text)
    toml_edit.set_key(path, None, "default_model", "b")
    toml_edit.set_key(path, "sampling", "top_p", 0.5)
    assert path.read_text() == text.replace('"a"', '"b"') + "\n[sampling]\ntop_p = 0.5\n"


@pytest.mark.parametrize("text", [
    "when = 1979-05-27T07:32:00Z\n[sampling]\n'temperature' = 0.5\n",  # a date
    "[sampling]\ntop_p = 0.8\n[sampling.x]\ntemperature = 0.3\n",  # a nested table
])
def test_a_rewrite_that_cannot_write_a_value_is_refused(tmp_path, text):
    """(A literal-string key or a nested table defeats the line edit: the whole file would
    be rewritten, and ``dumps`` writes no date and no nested table.)"""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(toml_edit.CannotEdit, match="cannot write back"):
        toml_edit.set_key(path, "sampling", "temperature", 0.2)
    assert path.read_text() == text


def test_crlf_line_endings_are_kept(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b'# c\r\ndefault_model = "a" # d\r\n[sampling]\r\ntop_p = 0.8\r\n')
    toml_edit.set_key(path, "sampling", "temperature", 0.2)
    toml_edit.set_key(path, None, "default_model", "b")
    assert path.read_bytes() == (b'# c\r\ndefault_model = "b" # d\r\n[sampling]\r\ntop_p = 0.8\r\n'
                                 b"temperature = 0.2\r\n")


def test_a_byte_order_mark_is_kept_and_the_first_line_still_edited(tmp_path):
    """A file an editor saved with a UTF-8 BOM: its first line (a header here) is still found
    and edited in place, and the BOM is written back."""
    path = tmp_path / "config.toml"
    path.write_bytes(b"\xef\xbb\xbf[sampling]  # mine\ntop_p = 0.8\n")
    toml_edit.set_key(path, "sampling", "top_p", 0.5)
    assert path.read_bytes() == b"\xef\xbb\xbf[sampling]  # mine\ntop_p = 0.5\n"


def test_dotted_keys_after_a_multiline_string_holding_a_header(tmp_path):
    """The top level ends at the first real header, not at a ``[...]`` line inside a string;
    a dotted key's multi-line value is replaced whole."""
    path = tmp_path / "config.toml"
    path.write_text('s = """\n[other]\n"""\nsampling.stop = [\n  "a",\n]  # p\n')
    toml_edit.set_key(path, "sampling", "temperature", 0.25)
    assert path.read_text() == ('s = """\n[other]\n"""\nsampling.stop = [\n  "a",\n]  # p\n'
                                "sampling.temperature = 0.25\n")
    toml_edit.set_key(path, "sampling", "stop", "b")
    assert path.read_text() == ('s = """\n[other]\n"""\nsampling.stop = "b"  # p\n'
                                "sampling.temperature = 0.25\n")


def test_a_sampling_key_written_at_the_top_level_says_where_it_goes(run):
    """``temperature = 0.3`` at the top of config.toml is ignored (it is sampling.temperature);
    the warning says where it goes. Another unknown key gets the plain warning."""
    settings.config_path().write_text("temperature = 0.3\ncolour = 'red'\n")
    code, _, err = run("config", "show")
    assert code == 0
    warnings = [line for line in err.splitlines() if "unknown key" in line]
    assert warnings == [
        "localchat: warning: config file: unknown key 'temperature' (ignored): a sampling "
        "setting goes under [sampling], or write sampling.temperature (localchat config set "
        "temperature VALUE does that)",
        "localchat: warning: config file: unknown key 'colour' (ignored; see 'localchat "
        "config show')"]
