"""`localchat` CLI: exit codes, one-line errors, stdin handling and streamed answers.

Subprocess tests run the real entry point (``python -m localchat.app.cli``) and check stdout
and stderr separately (DESIGN.md sections 7 and 9). In-process tests drive ``ask`` with a fake
engine where the model does not matter.

Subprocesses inherit the environment, so they use the same model cache as
``tests/conftest.py`` (``LOCALCHAT_HOME`` or the platformdirs default; CI fills it with
``localchat pull smollm2-135m``). ``LOCALCHAT_TEST_HOME`` points them at another home.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localchat.app import cli, cli_io
from localchat.engine.outputs import RequestOutput
from localchat.engine.request import FinishReason

CAPITAL = "What is the capital of France?"
GREEDY = ["--temperature", "0", "--max-tokens", "24"]


# -- helpers and fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def home(request) -> Path | None:
    """The LOCALCHAT_HOME for subprocesses (see the module docstring), or None to inherit."""
    env = os.environ.get("LOCALCHAT_TEST_HOME")
    return Path(env) if env else None


@pytest.fixture(scope="module")
def env(home) -> dict[str, str]:
    """Environment of the CLI subprocesses: the test home, no colour forcing, no debug."""
    e = {k: v for k, v in os.environ.items() if k not in ("LOCALCHAT_DEBUG", "FORCE_COLOR")}
    e["LOCALCHAT_HOME"] = str(home) if home else e.get("LOCALCHAT_HOME", "")
    if not e["LOCALCHAT_HOME"]:
        del e["LOCALCHAT_HOME"]
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


def test_help_and_no_command(env):
    for args in (["--help"], []):
        proc = run(env, *args)
        assert proc.returncode == 0 and proc.stderr == b""
        assert b"ask" in proc.stdout and b"pull" in proc.stdout and b"models" in proc.stdout
    proc = run(env, "ask", "--help")
    assert proc.returncode == 0 and b"--max-tokens" in proc.stdout


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


def test_ask_streams_the_answer(env, gguf):
    proc = run(env, "ask", CAPITAL, *GREEDY)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "Paris" in out
    assert "\x1b" not in out
    assert out.endswith("\n") and not out.endswith("\n\n")
    assert "Traceback" not in proc.stderr.decode()


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


# -- in-process: ask with a fake engine -------------------------------------------------------


class FakeTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.messages = messages
        return [1, 2, 3]


class FakeEngine:
    """Streams fixed deltas; raises KeyboardInterrupt after ``interrupt_after`` deltas."""

    max_model_len = 4096

    def __init__(self, deltas, interrupt_after=None):
        self.tokenizer = FakeTokenizer()
        self.deltas, self.interrupt_after = deltas, interrupt_after
        self.closed = False

    def generate(self, prompt_token_ids, sampling_params, request_id=None):
        self.sampling_params = sampling_params
        text = ""
        try:
            for i, delta in enumerate(self.deltas):
                if i == self.interrupt_after:
                    raise KeyboardInterrupt
                text += delta
                last = i == len(self.deltas) - 1
                yield RequestOutput(
                    "r",
                    [i],
                    delta,
                    text,
                    3,
                    i + 1,
                    finished=last,
                    finish_reason=FinishReason.STOP if last else None,
                )
        finally:
            self.closed = True


@pytest.fixture
def fake_ask(monkeypatch, capsys):
    """Run ``ask`` in-process on a FakeEngine; returns (exit code, stdout, stderr, engine)."""

    def go(args, deltas, *, stdin: bytes | None = None, interrupt_after=None):
        engine = FakeEngine(deltas, interrupt_after)
        monkeypatch.setattr(cli, "_load_engine", lambda spec: engine)
        monkeypatch.setattr(cli, "_default_model", lambda: "fake")
        if stdin is None:
            monkeypatch.setattr(sys, "stdin", None)
        else:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err, engine

    return go


def test_exactly_one_trailing_newline(fake_ask):
    code, out, err, _ = fake_ask(["hi"], ["Hel", "lo\n", "\n", "\n"])
    assert (code, out, err) == (0, "Hello\n", "")
    code, out, _, _ = fake_ask(["hi"], ["a\n\nb", ""])
    assert out == "a\n\nb\n"


def test_prompt_composition_and_system_message(fake_ask):
    code, _, _, engine = fake_ask(["QUESTION", "-s", "SYS", "--seed", "7"], ["x"], stdin=b"CTX\n")
    assert code == 0
    assert engine.tokenizer.messages == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "CTX\n\nQUESTION"},
    ]
    assert engine.sampling_params.seed == 7
    _, _, _, engine = fake_ask(["QUESTION", "--no-stdin"], ["x"], stdin=b"CTX\n")
    assert engine.tokenizer.messages == [{"role": "user", "content": "QUESTION"}]


def test_new_sampling_flags_reach_sampling_params(fake_ask):
    code, _, _, engine = fake_ask(
        ["hi", "--min-p", "0.1", "--repetition-penalty", "1.3", "--presence-penalty", "0.5",
         "--frequency-penalty", "-0.5", "--stop", "END", "--stop", "\n\n"], ["x"])
    sp = engine.sampling_params
    assert code == 0
    assert (sp.min_p, sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (
        0.1, 1.3, 0.5, -0.5)
    assert sp.stop == ("END", "\n\n")
    _, _, _, engine = fake_ask(["hi"], ["x"])
    assert engine.sampling_params.stop == () and engine.sampling_params.min_p == 0.0


def test_no_stream_writes_once_at_the_end(fake_ask, monkeypatch):
    deltas = ["Hel", "lo\n", "", "wor", "ld\n\n"]
    _, streamed, _, _ = fake_ask(["hi"], deltas)
    writes = []
    real = cli_io.AnswerWriter.finish

    def finish(self):
        writes.append(self.buffered)
        real(self)

    monkeypatch.setattr(cli_io.AnswerWriter, "finish", finish)
    code, whole, err, _ = fake_ask(["hi", "--no-stream"], deltas)
    assert (code, err) == (0, "") and whole == streamed == "Hello\nworld\n"
    assert writes == [True]
    buf = io.StringIO()
    w = cli_io.AnswerWriter(buf, buffered=True)
    for d in deltas:
        w.write(d)
        assert buf.getvalue() == ""
    w.finish()
    assert buf.getvalue() == "Hello\nworld\n"
    # Ctrl+C while not streaming still prints what was generated
    code, out, _, _ = fake_ask(["hi", "--no-stream"], ["one ", "two ", "x"], interrupt_after=2)
    assert (code, out) == (130, "one two \n")


class CharTokenizer:
    """``role:content|`` per message, one id per character (as in test_session.py)."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        return [ord(c) for c in text + ("assistant:" if add_generation_prompt else "")]


def test_fit_prompt_reserves_reply_room_and_notes_dropped_turns(capsys):
    from localchat.app.session import ChatSession

    session = ChatSession(system="S")
    for i in range(10):
        session.add_user(f"q{i}")
        session.add_assistant(f"a{i}")
    session.add_user("last")
    full = len(session.to_prompt_token_ids(CharTokenizer()))  # 10 pairs, 21 chars each
    # room for the whole conversation plus the reply: nothing dropped, no note
    ids = cli.fit_prompt(session, CharTokenizer(), full + 20, 20)
    assert len(ids) == full and capsys.readouterr().err == ""
    # max_tokens 50 must be reserved: 50 - 20 = 30 more tokens go, i.e. 2 pairs of 21
    ids = cli.fit_prompt(session, CharTokenizer(), full + 20, 50)
    assert len(ids) == full - 2 * 21 and session.last_dropped_turns == 2
    assert capsys.readouterr().err == (
        f"localchat: note: dropped 2 earlier turns to fit the context ({full + 20} tokens)\n")
    # no --max-tokens: 512 reserved, but never more than half the context
    cli.fit_prompt(session, CharTokenizer(), 100, None)
    assert 100 - len(cli.fit_prompt(session, CharTokenizer(), 100, None)) >= 50
    assert "dropped" in capsys.readouterr().err
    # system + latest fit the context but not the reserve: sent, the engine caps the reply
    minimal = len("system:S|user:last|assistant:")
    ids = cli.fit_prompt(session, CharTokenizer(), minimal + 1, 500)
    assert len(ids) == minimal and session.last_dropped_turns == 10
    capsys.readouterr()
    # no room at all: the one-line error of ContextLengthError (exit 1 through run_cli)
    from localchat.engine.errors import ContextLengthError

    with pytest.raises(ContextLengthError):
        cli.fit_prompt(session, CharTokenizer(), minimal, 500)


def test_fit_prompt_prints_the_system_fold_note_once(capsys):
    import warnings

    from localchat.app.session import ChatSession
    from localchat.engine.tokenizer import SystemPromptFoldedWarning

    class Folding(CharTokenizer):
        def apply_chat_template(self, messages, add_generation_prompt=True):
            warnings.warn("the template has no system role; folded", SystemPromptFoldedWarning,
                          stacklevel=2)
            return super().apply_chat_template(messages, add_generation_prompt)

    session = ChatSession(system="S")
    for i in range(5):
        session.add_user(f"q{i}")
        session.add_assistant(f"a{i}")
    session.add_user("last")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as run_cli does without --debug
        cli.fit_prompt(session, Folding(), 60, 10)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "localchat: note: the template has no system role; folded"
    assert len(err) == 2 and err[1].startswith("localchat: note: dropped ")


def test_ctrl_c_keeps_the_partial_answer_and_exits_130(fake_ask):
    code, out, _, engine = fake_ask(["hi"], ["one ", "two ", "three"], interrupt_after=2)
    assert code == 130
    assert out == "one two \n"
    assert engine.closed


def test_unexpected_exception_is_one_line_without_traceback(fake_ask, monkeypatch, capsys):
    def boom(spec):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli, "_load_engine", boom)
    monkeypatch.setattr(cli, "_default_model", lambda: "fake")
    monkeypatch.setattr(sys, "stdin", None)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == "localchat: error: internal error: RuntimeError('kaboom'); rerun with --debug\n"
    with pytest.raises(RuntimeError):
        cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi", "--debug"])


def test_build_prompt_and_sampling_messages():
    assert cli_io.build_prompt("Q", "C\n\n") == "C\n\nQ"
    assert cli_io.build_prompt(None, "C\n") == "C"
    assert cli_io.build_prompt("Q", "") == "Q"
    with pytest.raises(cli_io.CliUsageError):
        cli_io.build_prompt("", " \n")
    msg = cli_io.sampling_error_message(
        ValueError("top_p must be in (0, 1], got 2"), cli.SAMPLING_FLAGS
    )
    assert msg == "--top-p must be in (0, 1], got 2"


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
