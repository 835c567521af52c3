"""`localchat ask` in-process with a fake streaming engine: output framing, prompt
composition, sampling flags, context fitting, Ctrl+C and internal errors (no model needed)."""

from __future__ import annotations

import io
import sys

import pytest

from localchat.app import ask_cmd, cli, cli_input, cli_io

from .fake_engine import CharTokenizer, FakeEngine

# -- in-process: ask with a fake engine -------------------------------------------------------


@pytest.fixture
def fake_ask(monkeypatch, capsys, tmp_path):
    """Run ``ask`` in-process on a FakeEngine in a fresh LOCALCHAT_HOME; returns (exit code,
    stdout, stderr, engine)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))

    def go(args, deltas, *, stdin: bytes | None = None, interrupt_after=None):
        engine = FakeEngine(deltas, interrupt_after=interrupt_after)
        monkeypatch.setattr(ask_cmd, "load_engine", lambda options: engine)
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


def test_blank_lines_before_the_answer_are_not_written(fake_ask):
    """A reply that opens with blank lines starts at its first character; blank lines and
    indentation inside it stay."""
    code, out, err, _ = fake_ask(["hi"], ["\n", "\n", "  Hel", "lo\n\n", "x"])
    assert (code, out, err) == (0, "  Hello\n\nx\n", "")
    code, out, _, _ = fake_ask(["hi", "--no-stream"], ["\n\nHi"])
    assert out == "Hi\n"
    code, out, _, _ = fake_ask(["hi"], ["\n", "\n"])  # nothing but newlines: one newline
    assert (code, out) == (0, "\n")


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
    _, _, _, engine = fake_ask(["hi", "--top-p", "0.9", "--top-k", "40", "--max-tokens", "17",
                                "--temperature", "0"], ["x"])
    sp = engine.sampling_params
    assert (sp.top_p, sp.top_k, sp.max_tokens, sp.temperature) == (0.9, 40, 17, 0.0)


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


def test_fit_prompt_reserves_reply_room_and_notes_dropped_turns(capsys):
    from localchat.app.session import ChatSession

    session = ChatSession(system="S")
    for i in range(10):
        session.add_user(f"q{i}")
        session.add_assistant(f"a{i}")
    session.add_user("last")
    full = len(session.to_prompt_token_ids(CharTokenizer()))  # 10 pairs, 21 chars each
    # room for the whole conversation plus the reply: nothing dropped, no note
    ids = ask_cmd.fit_prompt(session, CharTokenizer(), full + 20, 20)
    assert len(ids) == full and capsys.readouterr().err == ""
    # max_tokens 50 must be reserved: 50 - 20 = 30 more tokens go, i.e. 2 pairs of 21
    ids = ask_cmd.fit_prompt(session, CharTokenizer(), full + 20, 50)
    assert len(ids) == full - 2 * 21 and session.last_dropped_turns == 2
    assert capsys.readouterr().err == (
        f"localchat: note: dropped 2 earlier turns to fit the context ({full + 20} tokens)\n")
    # no --max-tokens: 512 reserved, but never more than half the context
    ask_cmd.fit_prompt(session, CharTokenizer(), 100, None)
    assert 100 - len(ask_cmd.fit_prompt(session, CharTokenizer(), 100, None)) >= 50
    assert "dropped" in capsys.readouterr().err
    # system + latest fit the context but not the reserve: sent, the engine caps the reply
    minimal = len("system:S|user:last|assistant:")
    ids = ask_cmd.fit_prompt(session, CharTokenizer(), minimal + 1, 500)
    assert len(ids) == minimal and session.last_dropped_turns == 10
    capsys.readouterr()
    # no room at all: the one-line error of ContextLengthError (exit 1 through run_cli)
    from localchat.engine.errors import ContextLengthError

    with pytest.raises(ContextLengthError):
        ask_cmd.fit_prompt(session, CharTokenizer(), minimal, 500)


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
        ask_cmd.fit_prompt(session, Folding(), 60, 10)
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

    monkeypatch.setattr(ask_cmd, "load_engine", boom)
    monkeypatch.setattr(sys, "stdin", None)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == "localchat: error: internal error: RuntimeError('kaboom'); rerun with --debug\n"
    with pytest.raises(RuntimeError):
        cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "hi", "--debug"])


def test_extra_words_after_the_prompt_say_to_quote_it(fake_ask):
    code, out, err, _ = fake_ask(["Hi", "there", "friend"], ["x"])
    assert (code, out) == (2, "")
    assert err.startswith("localchat: error: Got unexpected extra argument") and \
        err.endswith("(there friend); quote a prompt of several words: localchat ask \"...\" "
                     "(see 'localchat ask --help')\n") and err.count("\n") == 1, err


def test_a_prompt_starting_with_a_dash_says_to_put_it_after_double_dash(fake_ask):
    code, out, err, _ = fake_ask(["-5 plus 3?"], ["x"])
    assert (code, out) == (2, "")
    assert err == ("localchat: error: No such option: -5; a prompt that starts with '-' goes "
                   "after --: localchat ask [OPTIONS] -- \"...\" (see 'localchat ask --help')\n")
    # a misspelt option keeps click's suggestion and gets no such hint
    code, _, err, _ = fake_ask(["--max-tokenz", "5", "Hi"], ["x"])
    assert code == 2 and "Possible options: --max-tokens" in err and "goes after --" not in err


@pytest.mark.parametrize("prompt, option, value", [
    ("-make it short", "-m", "ake it short"), ("-sorry, again", "-s", "orry, again"),
    ("-Count to 3", "-C", "ount to 3")])
def test_a_prompt_read_as_a_short_option_with_its_value_says_so(fake_ask, prompt, option,
                                                                value):
    """click reads ``ask "-make it short"`` as ``-m "ake it short"`` (a short option takes
    the rest of its word); the error that follows (no prompt; a bad --context) says so, and
    how to pass such a prompt, before the help pointer."""
    code, out, err, engine = fake_ask([prompt], ["x"])
    assert (code, out, engine.sampling_params) == (2, "", None)  # nothing generated
    assert err.endswith(f"; '{prompt}' was read as {option} '{value}': a prompt that starts "
                        f"with '-' goes after --: localchat ask [OPTIONS] -- \"{prompt}\" "
                        "(see 'localchat ask --help')\n") and err.count("\n") == 1, err
    code, out, err, _ = fake_ask(["--", prompt], ["x"])  # the way it says
    assert (code, out, err) == (0, "x\n", "")


def test_a_piped_prompt_with_a_misread_system_prompt_is_warned(fake_ask):
    """``echo text | ask "-sorry"`` answers the piped text with the system prompt "orry":
    a warning says so; ``-s'be brief'`` with a prompt argument, or spaced, gets none."""
    code, out, err, engine = fake_ask(["-sorry"], ["x"], stdin=b"The quick brown fox.")
    assert (code, out) == (0, "x\n")
    assert err == ("localchat: warning: '-sorry' was read as -s 'orry' (the system prompt); a "
                   "prompt that starts with '-' goes after --: localchat ask [OPTIONS] -- "
                   "\"-sorry\"\n")
    for args in (["-sbe brief", "Hi"], ["-s", "orry"]):
        code, out, err, _ = fake_ask(args, ["x"], stdin=b"text")
        assert (code, err) == (0, ""), err


def test_the_misread_prompt_hint_only_where_that_prompt_causes_the_error():
    from localchat.app.argv_hints import with_misread_prompt

    args = ["ask", "-make it short"]
    msg = "'ake it short' is not a model alias, a local .gguf file or model folder"
    assert with_misread_prompt(args, msg).startswith(msg + "; '-make it short' was read as -m")
    assert with_misread_prompt(args, "history cannot be used") == "history cannot be used"
    assert with_misread_prompt(["ask", "--", "-make"], "no prompt: x") == "no prompt: x"
    assert with_misread_prompt(["history", "-mx"], "no prompt: x") == "no prompt: x"
    # a word after it is the prompt: the option was meant (a --long option's value is not)
    msg = "'bogus' is not a model alias"
    assert with_misread_prompt(["ask", "-mbogus", "Hi"], msg) == msg
    assert with_misread_prompt(["ask", "-mbogus", "--max-tokens", "5"], msg) != msg


def test_options_after_double_dash_say_to_put_them_first(fake_ask):
    code, out, err, _ = fake_ask(["--", "-5 plus 3?", "--max-tokens", "5"], ["x"])
    assert (code, out) == (2, "")
    assert err.endswith("(--max-tokens 5); options go before -- (see 'localchat ask --help')\n")


def test_build_prompt_and_sampling_messages():
    assert cli_input.build_prompt("Q", "C\n\n") == "C\n\nQ"
    assert cli_input.build_prompt(None, "C\n") == "C"
    assert cli_input.build_prompt("Q", "") == "Q"
    with pytest.raises(cli_io.CliUsageError, match="pass PROMPT or pipe text on stdin"):
        cli_input.build_prompt("", " \n")
    assert cli_input.build_prompt("Q", None) == "Q"
    with pytest.raises(cli_io.CliUsageError, match=r"pass PROMPT \(--no-stdin leaves stdin "):
        cli_input.build_prompt(None, None)  # stdin not read
    msg = cli_io.sampling_error_message(
        ValueError("top_p must be in (0, 1], got 2"), ask_cmd.SAMPLING_FLAGS
    )
    assert msg == "--top-p must be in (0, 1], got 2"
