"""`localchat` CLI: exit codes, one-line errors, stdin handling and streamed answers.

Subprocess tests run the real entry point (``python -m localchat.app.cli``) and check stdout
and stderr separately (README, Usage: stdout carries only the answer, errors are one line).
In-process tests drive ``ask`` with a fake engine where the model does not matter.

Subprocesses get a fresh ``LOCALCHAT_HOME`` (history and config of their own) whose cache is
the model cache of ``tests/conftest.py`` (``LOCALCHAT_HOME`` or the platformdirs default; CI
fills it with ``localchat pull smollm2-135m``); ``LOCALCHAT_TEST_HOME`` names another cache's
home.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CAPITAL = "What is the capital of France?"
GREEDY = ["--temperature", "0", "--max-tokens", "24"]


# -- helpers and fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """Environment of the CLI subprocesses: a fresh LOCALCHAT_HOME (its own history and config)
    whose ``cache`` links to the shared model cache (``LOCALCHAT_TEST_HOME``'s, else the one the
    tests use), no colour forcing, no debug, no settings from the environment."""
    from localchat.app import settings

    test_home = os.environ.get("LOCALCHAT_TEST_HOME")
    cache = Path(test_home) / "cache" if test_home else settings.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("home")
    (home / "cache").symlink_to(cache, target_is_directory=True)
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("LOCALCHAT_") and k not in ("FORCE_COLOR", "NO_COLOR")}
    e["LOCALCHAT_HOME"] = str(home)
    return e


def run(env, *args: str, stdin: bytes | None = None, timeout: float = 600):
    """Run ``localchat ARGS`` in a subprocess; stdin is /dev/null unless bytes are given."""
    return subprocess.run(
        [sys.executable, "-m", "localchat.app.cli", *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(proc, code: int, *needles: str) -> str:
    """Exit ``code``, empty stdout, exactly one ``localchat: error:`` line on stderr."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == code, (proc.returncode, err)
    assert proc.stdout == b""
    lines = [ln for ln in err.splitlines() if ln.startswith("localchat: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "internal error" not in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def gguf(env) -> Path:
    """The smollm2-135m GGUF file, via ``localchat pull`` (cached in the test home)."""
    proc = run(env, "pull", "smollm2-135m", timeout=900)
    if proc.returncode != 0:
        pytest.skip(f"smollm2-135m unavailable: {proc.stderr.decode(errors='replace')[-300:]}")
    path = Path(proc.stdout.decode().strip())
    assert path.is_file() and proc.stdout.decode().count("\n") == 1
    return path


# -- usage errors (exit 2): no model needed ---------------------------------------------------


def test_no_prompt_and_empty_stdin_is_a_usage_error(env):
    assert_one_line_error(run(env, "ask"), 2, "no prompt")
    assert_one_line_error(run(env, "ask", stdin=b" \n\t\n"), 2, "no prompt")
    assert_one_line_error(run(env, "ask", "  "), 2, "no prompt")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--temperature", "-1"], "--temperature"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-3"], "--top-k"),
        (["--top-k", "99999999999999999999"], "--top-k"),
        (["--temperature", "warm"], "--temperature"),
        (["--min-p", "1.5"], "--min-p"),
        (["--min-p", "-0.1"], "--min-p"),
        (["--repetition-penalty", "0"], "--repetition-penalty"),
        (["--repetition-penalty", "-1"], "--repetition-penalty"),
        (["--presence-penalty", "2.5"], "--presence-penalty"),
        (["--frequency-penalty", "-3"], "--frequency-penalty"),
        (["--stop", ""], "--stop"),
        (["--min-p", "lots"], "--min-p"),
    ],
)
def test_bad_flag_values_name_the_flag(env, args, flag):
    line = assert_one_line_error(run(env, "ask", "hi", *args), 2, flag)
    if args[1] not in ("warm", "lots"):
        assert "must be" in line  # the allowed range is stated


def test_unknown_flag_and_command_are_one_line_usage_errors(env):
    assert_one_line_error(run(env, "ask", "hi", "--bogus"), 2, "--bogus")
    assert_one_line_error(run(env, "frobnicate"), 2, "frobnicate")
    assert_one_line_error(run(env, "pull"), 2)
    # an empty MODEL ("$MODEL" unset) is a usage error, as -m "" is
    for command in ("pull", "plan"):
        assert_one_line_error(run(env, command, " "), 2, "MODEL is empty")


def test_help_and_no_command(env):
    for args in (["--help"], []):
        proc = run(env, *args)
        assert proc.returncode == 0 and proc.stderr == b""
        assert b"ask" in proc.stdout and b"pull" in proc.stdout and b"models" in proc.stdout
    proc = run(env, "ask", "--help")
    assert proc.returncode == 0 and b"--max-tokens" in proc.stdout


@pytest.mark.parametrize("args", [["-m", "nosuch"], ["--theme", "light"],
                                  ["--endpoint", "http://127.0.0.1:9/v1"], ["chat"]])
def test_tui_flags_without_a_terminal_are_a_usage_error_not_the_help(env, args):
    """Without a terminal, ``localchat`` alone prints its help (exit 0); given a TUI flag it
    is the TUI that was asked for, as with ``chat``: one line, exit 2, never the help with the
    flag dropped."""
    assert_one_line_error(run(env, *args), 2, "the chat TUI needs a terminal")


@pytest.mark.parametrize("args", [["--theme", "neon"], ["chat", "--theme", "neon"]])
def test_an_unknown_theme_flag_is_a_usage_error(env, args):
    """``config set theme neon`` was refused while ``chat --theme neon`` opened the TUI with
    a notification: the flag is now checked against the same themes, before anything."""
    assert_one_line_error(run(env, *args), 2, "--theme neon: no such theme")


# -- runtime errors (exit 1) ------------------------------------------------------------------


def test_unknown_alias(env):
    assert_one_line_error(run(env, "ask", "hi", "-m", "no-such-model-xyz"), 1, "no-such-model-xyz")


def test_missing_gguf_path(env, tmp_path):
    missing = tmp_path / "absent.gguf"
    assert_one_line_error(run(env, "ask", "hi", "-m", str(missing)), 1, "absent.gguf")


def test_file_that_is_not_a_model(env, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n")
    assert_one_line_error(run(env, "ask", "hi", "-m", str(text)), 1)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"this is not a GGUF file at all\n" * 100)
    assert_one_line_error(run(env, "ask", "hi", "-m", str(fake)), 1)


def test_truncated_gguf(env, gguf, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(gguf, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    assert_one_line_error(run(env, "ask", "hi", "-m", str(truncated)), 1)


def test_invalid_utf8_on_stdin_warns_instead_of_crashing(env, tmp_path):
    proc = run(env, "ask", "-m", str(tmp_path / "absent.gguf"), stdin=b"caf\xe9 \xff\n")
    err = proc.stderr.decode()
    assert "localchat: warning:" in err and "UTF-8" in err
    assert proc.returncode == 1 and "Traceback" not in err


def test_models_lists_the_catalog_as_plain_text(env):
    proc = run(env, "models")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "\x1b" not in out
    assert out.splitlines()[0].split()[:4] == ["ALIAS", "SOURCE", "SIZE", "CACHED"]
    assert any(line.startswith("smollm2-135m ") for line in out.splitlines())


# -- the real model --------------------------------------------------------------------------


def test_ask_streams_the_answer_and_json_has_the_same_content(env, gguf):
    proc = run(env, "ask", CAPITAL, *GREEDY)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "Paris" in out
    assert "\x1b" not in out
    assert out.endswith("\n") and not out.endswith("\n\n")
    assert "Traceback" not in proc.stderr.decode()
    proc = run(env, "ask", CAPITAL, *GREEDY, "--json", "--stats", "--no-save")
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert doc["content"] == out[:-1] and doc["model"] == "smollm2-135m"
    assert doc["finish_reason"] in ("stop", "length") and doc["conversation_id"] is None
    assert 0 < doc["usage"]["completion_tokens"] <= 24 and doc["usage"]["prompt_tokens"] > 10
    assert doc["timings"]["ttft_s"] > 0 and doc["timings"]["prefill_tokens_per_s"] > 0
    # SmolLM2's weights alone are 538 MB in fp32, 269 MB in bf16 (the float format of a CPU
    # with native bf16), 96.6 MB in the GGUF's own format (auto's pick where the C++ kernels
    # are built); the prediction adds the KV pool, and the allocation matches it.
    mem = doc["memory"]
    weights = {"fp32": 538e6, "bf16": 269e6, "native": 96e6}[mem["format"]]
    assert mem["predicted_bytes"] > weights and mem["measured"]
    assert abs(mem["measured_bytes"] - mem["predicted_bytes"]) <= 0.02 * mem["predicted_bytes"]
    stats = proc.stderr.decode().splitlines()
    assert len(stats) == 1 and stats[0].startswith("localchat: stats: ttft ")


def test_piped_stdin_equals_the_combined_argument(env, gguf):
    """``echo CONTEXT | ask QUESTION`` is ``ask "CONTEXT\\n\\nQUESTION"`` (a local .gguf path)."""
    context = "My cat is called Tom. My dog is called Rex."
    question = "What is the name of my dog?"
    piped = run(env, "ask", question, "-m", str(gguf), *GREEDY, stdin=(context + "\n").encode())
    combined = run(env, "ask", f"{context}\n\n{question}", "-m", str(gguf), *GREEDY)
    assert piped.returncode == 0 and combined.returncode == 0, piped.stderr.decode()
    assert piped.stdout == combined.stdout
    assert piped.stdout.strip()


def test_no_stream_prints_the_same_bytes_as_streaming(env, gguf):
    """``--no-stream`` prints the whole answer at the end: byte for byte the streamed output."""
    args = ["ask", "Write three short lines about the sea.", "-m", str(gguf),
            "--temperature", "0", "--max-tokens", "48"]
    streamed = run(env, *args)
    whole = run(env, *args, "--no-stream")
    assert streamed.returncode == 0 and whole.returncode == 0, whole.stderr.decode()
    assert whole.stdout == streamed.stdout
    assert len(streamed.stdout.strip()) > 20


def test_prompt_longer_than_the_context_is_one_error_line(env, gguf):
    """Nothing to drop in ``ask``: a prompt over the context is exit 1, one line, no stdout."""
    long_prompt = "word " * 12000
    assert_one_line_error(run(env, "ask", long_prompt, "-m", str(gguf)), 1, "tokens")


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX only")
def test_sigint_during_generation_exits_130(env, gguf):
    """Ctrl+C while streaming: what was printed stays, one newline, exit 130."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localchat.app.cli",
            "ask",
            "Write a long story about a dragon.",
            "-m",
            str(gguf),
            "--temperature",
            "0",
            "--max-tokens",
            "400",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        bufsize=0,  # unbuffered: read(1) must not pull bytes that communicate() then misses
        stderr=subprocess.PIPE,
        env=env,
    )
    first = proc.stdout.read(1)  # blocks until the answer starts streaming
    if proc.poll() is not None:
        pytest.skip("the answer finished before the signal could be sent")
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    out = (first + rest).decode()
    assert proc.returncode == 130, err.decode()
    assert out.endswith("\n") and len(out) > 1
    assert "Traceback" not in err.decode()
    from localchat.app.store import Store

    with Store(Path(env["LOCALCHAT_HOME"]) / "data" / "history.db") as store:
        msgs = store.most_recent().messages
    assert [(m.role, m.interrupted) for m in msgs[-2:]] == [("user", False), ("assistant", True)]
    assert msgs[-2].content == "Write a long story about a dragon."
    assert msgs[-1].content == out[:-1]  # saved exactly what was printed


def test_broken_pipe_stops_quietly_with_141(env, gguf):
    """`localchat ask ... | head -c 20`: generation stops, no traceback, exit 128 + SIGPIPE."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "localchat.app.cli", "ask", "-m", str(gguf), "--temperature", "0",
         "--max-tokens", "200", "--", "Write a long essay about the history of Rome."],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    first = proc.stdout.read(20)
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    assert proc.wait(timeout=600) == 141, err
    assert len(first) == 20
    assert "Traceback" not in err and "error" not in err
