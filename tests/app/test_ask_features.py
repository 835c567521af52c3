"""``ask`` features in-process with a fake engine: --json, --stats, -x, history (-c,
--conversation, --no-save, interrupted replies), Ctrl+C, invalid UTF-8 (engine options and
settings precedence: ``test_ask_options.py``)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from localchat.app import ask_cmd, cli, cli_io, interrupts, settings
from localchat.app.store import Store

from .fake_engine import CharTokenizer, FakeEngine, decode_ids

CODE_REPLY = ["Use this:\n```py", "thon\nprint('hi')\n", "```\nand also\n~~~\nls -l\n~~~\n", "Bye."]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    for key in settings.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    return tmp_path / "home"


@pytest.fixture
def ask(home, monkeypatch, capsys):
    """``ask(args, deltas)`` -> (exit code, stdout, stderr, engine, load options)."""

    def go(args, deltas=("Hello", " world"), *, stdin: bytes | None = None, interrupt_after=None,
           load_error: Exception | None = None, max_model_len: int = 4096):
        engine = FakeEngine(deltas, interrupt_after=interrupt_after, max_model_len=max_model_len)
        loaded = []

        def load(options):
            if load_error is not None:
                raise load_error
            loaded.append(options)
            return engine

        monkeypatch.setattr(ask_cmd, "load_engine", load)
        monkeypatch.setattr(sys, "stdin", None if stdin is None
                            else io.TextIOWrapper(io.BytesIO(stdin)))
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", *args])
        out = capsys.readouterr()
        return code, out.out, out.err, engine, (loaded[0] if loaded else None)

    return go


def test_json_has_every_field(ask):
    code, out, err, engine, _ = ask(["hi", "--json", "-m", "my-model"], ["Hel", "lo\n", "!"])
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert out.count("\n") == 1 and out.endswith("\n")
    assert doc["content"] == "Hello\n!" and doc["model"] == "my-model"
    assert doc["finish_reason"] == "stop"
    assert doc["usage"]["prompt_tokens"] == len(engine.prompt_token_ids)
    assert doc["usage"]["completion_tokens"] == 3
    assert set(doc["usage"]) == {"prompt_tokens", "cached_tokens", "completion_tokens"}
    assert set(doc["timings"]) == {"ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s"}
    assert doc["timings"]["ttft_s"] >= 0 and doc["timings"]["decode_tokens_per_s"] > 0
    assert doc["speculative"] is None
    with Store() as store:
        assert store.most_recent().id == doc["conversation_id"]


def test_json_sampling_is_every_value_in_use(ask):
    """``sampling`` holds what the engine was given, penalties and stop strings included (the
    request's ``SamplingParams``, the reference)."""
    code, out, err, engine, _ = ask(["hi", "--json", "--stop", "ab", "--stop", "cd",
                                     "--presence-penalty", "0.5", "--frequency-penalty", "-0.25",
                                     "--temperature", "0.3", "--seed", "7"], ["x"])
    assert (code, err) == (0, ""), err
    sp = engine.sampling_params
    assert json.loads(out)["sampling"] == {
        "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "min_p": sp.min_p,
        "repetition_penalty": sp.repetition_penalty, "presence_penalty": 0.5,
        "frequency_penalty": -0.25, "stop": ["ab", "cd"], "max_tokens": sp.max_tokens,
        "seed": 7}
    assert (sp.temperature, sp.stop) == (0.3, ("ab", "cd"))


@pytest.mark.parametrize("drafted, accepted", [(0, 0), (8, 6)])
def test_json_speculative_with_a_drafter(ask, monkeypatch, drafted, accepted):
    """With a drafter loaded (``engine.speculator``), ``speculative`` is an object even when
    nothing was drafted (prompt lookup found no match): 0 tokens, no acceptance rate; without
    one it stays ``null`` (``test_json_has_every_field``)."""
    real_generate = FakeEngine.generate

    def generate(self, prompt_token_ids, sampling_params, request_id=None):
        for out in real_generate(self, prompt_token_ids, sampling_params, request_id):
            out.metrics.num_draft_tokens, out.metrics.num_accepted_tokens = drafted, accepted
            yield out

    monkeypatch.setattr(FakeEngine, "generate", generate)
    monkeypatch.setattr(FakeEngine, "speculator", object(), raising=False)
    code, out, err, _, _ = ask(["hi", "--json"], ["a", "b"])
    assert (code, err) == (0, "")
    assert json.loads(out)["speculative"] == {
        "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None}
    code, _, err, _, _ = ask(["hi", "--stats"], ["a", "b"])
    assert code == 0 and (", acceptance n/a (nothing drafted)," in err if not drafted
                          else ", acceptance 75%," in err)


def test_stats_is_one_stderr_line(ask):
    code, out, err, engine, _ = ask(["hi", "--stats"], ["a", "b", "c"])
    assert (code, out) == (0, "abc\n")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("localchat: stats: ttft ")
    assert f"prompt {len(engine.prompt_token_ids)} tokens" in lines[0]
    assert "reply 3 tokens" in lines[0] and "finish stop" in lines[0]


def test_extract_prints_only_the_code(ask):
    code, out, err, _, _ = ask(["hi", "-x"], CODE_REPLY)
    assert (code, err) == (0, "")
    assert out == "print('hi')\n\nls -l\n"
    code, out, err, _, _ = ask(["hi", "--extract"], ["no code here"])
    assert out == "no code here\n" and "no complete fenced code block" in err
    code, out, _, _, _ = ask(["hi", "-x", "--json"], CODE_REPLY)
    assert json.loads(out)["content"] == "print('hi')\n\nls -l"


def test_continue_sends_the_earlier_turns_to_the_model(ask):
    ask(["first question", "-s", "Be brief."], ["first answer"])
    ask(["other topic", "--no-save"], ["unsaved"])
    code, _, _, engine, _ = ask(["second question", "-c"], ["second answer"])
    assert code == 0
    expected = CharTokenizer().apply_chat_template([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ])
    assert engine.prompt_token_ids == expected
    assert decode_ids(engine.prompt_token_ids).startswith("system:Be brief.|user:first question")
    with Store() as store:
        convs = store.list_conversations()
        assert len(convs) == 1  # --no-save stored nothing
        conv = store.get_conversation(convs[0].id)
    assert [(m.role, m.content) for m in conv.messages] == [
        ("user", "first question"), ("assistant", "first answer"),
        ("user", "second question"), ("assistant", "second answer")]
    assert conv.title == "first question" and conv.system_prompt == "Be brief."


def test_conversation_id_picks_an_older_conversation(ask):
    ask(["about cats"], ["cats purr"])
    with Store() as store:
        cats = store.most_recent().id
    ask(["about dogs"], ["dogs bark"])
    code, _, _, engine, _ = ask(["more", "--conversation", cats[:6]], ["ok"])
    assert code == 0
    assert decode_ids(engine.prompt_token_ids) == (
        "user:about cats|assistant:cats purr|user:more|assistant:")
    code, out, err, _, _ = ask(["more", "--conversation", "zzzz"], ["ok"])
    assert code == 1 and out == "" and err.startswith("localchat: error: no conversation 'zzzz'")
    code, _, err, _, _ = ask(["more", "-c", "--conversation", cats], ["ok"])
    assert code == 2 and "not both" in err


def test_continue_with_no_save_reads_but_does_not_write(ask):
    ask(["q1", "-m", "model-of-q1"], ["a1"])
    code, _, _, engine, options = ask(["q2", "-c", "--no-save"], ["a2"])
    assert code == 0 and options.model == "model-of-q1"  # the conversation's model
    assert decode_ids(engine.prompt_token_ids) == "user:q1|assistant:a1|user:q2|assistant:"
    with Store() as store:
        assert store.most_recent().message_count == 2


def test_ctrl_c_saves_the_partial_reply_marked_interrupted(ask):
    code, out, err, engine, _ = ask(["tell me"], ["one ", "two ", "three"], interrupt_after=2)
    assert (code, out) == (130, "one two \n") and engine.closed
    with Store() as store:
        conv = store.most_recent()
        msgs = conv.messages
    assert err == f"localchat: interrupted; the reply so far is saved in conversation {conv.id}\n"
    assert [(m.role, m.content, m.interrupted) for m in msgs] == [
        ("user", "tell me", False), ("assistant", "one two ", True)]
    code, out, _, _, _ = ask(["tell me", "--json"], ["one ", "two"], interrupt_after=1)
    assert code == 130 and json.loads(out)["finish_reason"] == "interrupted"
    assert json.loads(out)["content"] == "one "
    code, out, err, _, _ = ask(["tell me", "--no-save"], ["one ", "two"], interrupt_after=1)
    assert (code, out, err) == (130, "one \n", "localchat: interrupted\n")
    code, out, err, _, _ = ask(["tell me"], ["one ", "two"], interrupt_after=0)  # no token yet
    with Store() as store:
        conv = store.most_recent()
    assert (code, out) == (130, "")
    assert err == f"localchat: interrupted; your message is saved in conversation {conv.id}\n"
    for flag in ("-x", "--no-stream"):  # the buffered outputs, too, write no empty line
        code, out, _, _, _ = ask(["tell me", flag], ["one ", "two"], interrupt_after=0)
        assert (code, out) == (130, "")


def test_ctrl_c_while_loading_keeps_the_piped_prompt(ask, monkeypatch, capsys):
    """Ctrl+C before the model has loaded (exit 130): the message, piped text included, is
    saved with an empty reply marked interrupted, as a Ctrl+C before the first token is;
    ``-c`` then continues from it. ``--no-save`` still saves nothing."""
    def interrupted(options):
        raise KeyboardInterrupt

    monkeypatch.setattr(ask_cmd, "load_engine", interrupted)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"piped text\n")))
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "-m", "m1", "review"])
    assert code == 130
    with Store() as store:
        conv = store.most_recent()
        assert capsys.readouterr().err == (
            f"localchat: interrupted; your message is saved in conversation {conv.id}\n")
        assert [(m.role, m.content, m.interrupted) for m in conv.messages] == [
            ("user", "piped text\n\nreview", False), ("assistant", "", True)]
        assert conv.model == "m1"
    code, _, _, engine, _ = ask(["next", "-c"], ["a2"])
    assert code == 0
    assert decode_ids(engine.prompt_token_ids) == (
        "user:piped text\n\nreview|assistant:|user:next|assistant:")
    monkeypatch.setattr(ask_cmd, "load_engine", interrupted)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "x", "--no-save"])
    assert (code, capsys.readouterr().err) == (130, "localchat: interrupted\n")
    with Store() as store:
        assert store.most_recent().id == conv.id and store.most_recent().message_count == 4
    # --json: one object of the answered shape, empty and interrupted (a script reads it)
    code, out, _, _, _ = ask(["hi", "--json"], ["x"])
    answered = json.loads(out)
    for args in (["x", "--json"], ["x", "--json", "--no-save"]):
        monkeypatch.setattr(ask_cmd, "load_engine", interrupted)
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", *args])
        doc = json.loads(capsys.readouterr().out)
        assert code == 130 and set(doc) == set(answered)
        assert (doc["content"], doc["finish_reason"]) == ("", "interrupted")
        with Store() as store:
            latest = store.most_recent().id
        assert doc["conversation_id"] == (None if "--no-save" in args else latest)


def test_user_message_is_committed_before_generation(ask, monkeypatch):
    seen = []

    class Peeking(FakeEngine):
        def generate(self, prompt_token_ids, sampling_params, request_id=None):
            with Store() as store:  # another connection, as another process would see it
                seen.extend((m.role, m.content) for m in store.most_recent().messages)
            yield from super().generate(prompt_token_ids, sampling_params, request_id)

    monkeypatch.setattr(ask_cmd, "load_engine", lambda options: Peeking(["x"]))
    monkeypatch.setattr(sys, "stdin", None)
    assert cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "keep me"]) == 0
    assert seen == [("user", "keep me")]


def test_continuing_a_conversation_whose_model_is_gone_says_so(ask, monkeypatch, capsys):
    """``-c`` without ``-m`` loads the conversation's model; when that file is gone the error
    names the conversation and the way on (``-m``), which then works."""
    from localchat.engine.errors import ModelNotFoundError

    code, _, _, _, _ = ask(["hi", "-m", "/gone/model.gguf"])
    assert code == 0
    with Store() as store:
        conv_id = store.most_recent().id

    def missing(options):
        raise ModelNotFoundError(f"no such file or folder: {options.model}")

    monkeypatch.setattr(ask_cmd, "load_engine", missing)
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", "-c", "again"])
    assert code == 1
    assert capsys.readouterr().err == (
        "localchat: error: no such file or folder: /gone/model.gguf (the model of conversation "
        f"{conv_id}; continue it with another: -m MODEL)\n")
    code, _, err, _, options = ask(["-c", "-m", "other-model", "again"])
    assert (code, err, options.model) == (0, "", "other-model")


def test_invalid_utf8_is_replaced_with_one_warning(ask):
    code, _, err, engine, _ = ask(["Q"], stdin=b"caf\xe9\n")
    assert code == 0
    assert engine.tokenizer.messages[-1]["content"] == "caf\ufffd\n\nQ"
    assert err == ("localchat: warning: stdin is not valid UTF-8; invalid bytes were replaced "
                   "with U+FFFD\n")


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX signals")
def test_interrupt_guard_holds_ctrl_c_until_the_critical_section_ends():
    guard = interrupts.InterruptGuard()
    done = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the run started in the background
    with guard.installed():
        with pytest.raises(KeyboardInterrupt), guard.critical():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now, and held the interrupt
            done.append("section finished")
        assert done == ["section finished"]
        with pytest.raises(KeyboardInterrupt):  # outside a section: at once
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(5)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_user_message_left_without_reply_is_joined_to_the_next(ask):
    ask(["q1"], ["a1"])
    with Store() as store:
        store.add_message(store.most_recent().id, "user", "lost q2")  # crashed before a reply
    code, _, _, engine, _ = ask(["q3", "-c"], ["a3"])
    assert code == 0
    assert decode_ids(engine.prompt_token_ids) == (
        "user:q1|assistant:a1|user:lost q2\n\nq3|assistant:")


def test_unreadable_history_warns_and_still_answers(ask, home):
    (home / "data").mkdir(parents=True)
    (home / "data" / "history.db").write_bytes(b"not a database" * 100)
    code, out, err, _, _ = ask(["hi"], ["fine"])
    assert (code, out) == (0, "fine\n")
    assert err.startswith("localchat: warning: this turn is not saved: history ")
    assert "history repair" in err and err.count("\n") == 1
    code, out, err, _, _ = ask(["hi", "-c"], ["fine"])  # continuing needs the history
    assert code == 1 and out == "" and err.startswith("localchat: error: history ")




def test_a_failed_turn_keeps_the_piped_text_in_a_file(ask, home):
    """Piped text of an ``ask`` that fails before its turn is saved (a model that cannot be
    loaded, a prompt too long for the context) is written, exactly as read, to a file of the
    user's alone that the error line names; nothing is kept without piped text, and a turn
    saved in the history needs no file."""
    from localchat.engine.errors import ModelNotFoundError

    piped = "diff --git a/x b/x\n+ caf\u00e9 \u2603\n"
    code, out, err, _, _ = ask(["review", "-m", "nope"], stdin=piped.encode(),
                               load_error=ModelNotFoundError("unknown model 'nope'"))
    assert (code, out) == (1, "") and err.count("\n") == 1
    head, path = err.rstrip("\n").split("; the piped text is kept in ")
    assert head == "localchat: error: unknown model 'nope'"
    assert Path(path).read_text(encoding="utf-8") == piped
    assert os.stat(path).st_mode & 0o777 == 0o600
    with Store() as store:
        assert store.most_recent() is None  # nothing half-saved in the history
    code, out, err, _, _ = ask(["x" * 9000], stdin=b"more piped text\n", max_model_len=512)
    assert code == 1 and "more than the" in err and "; the piped text is kept in " in err
    unsent = home / "data" / "unsent"
    assert sorted(f.read_text() for f in unsent.iterdir()) == sorted(["more piped text\n", piped])
    code, _, err, _, _ = ask(["review", "-m", "nope"],
                             load_error=ModelNotFoundError("unknown model 'nope'"))
    assert (code, err) == (1, "localchat: error: unknown model 'nope'\n")  # no stdin
    code, _, err, _, _ = ask(["review", "-m", "nope", "--no-save"], stdin=b"piped\n",
                             load_error=ModelNotFoundError("unknown model 'nope'"))
    assert (code, err) == (1, "localchat: error: unknown model 'nope'\n")  # nothing saved
    code, _, err, _, _ = ask(["review"], stdin=b"piped\n")
    assert (code, err) == (0, "") and len(list(unsent.iterdir())) == 2
    # read before the settings: a broken config file keeps it too (exit 1, one line)
    settings.config_path().write_text("temperature = [\n")
    code, _, err, _, _ = ask(["review"], stdin=b"third\n")
    assert code == 1 and err.count("\n") == 1 and "not valid TOML" in err
    assert Path(err.rstrip("\n").split("; the piped text is kept in ")[1]).read_text() == "third\n"
    settings.config_path().unlink()
    # an internal error: its line, after a note naming the file
    code, _, err, _, _ = ask(["review"], stdin=b"fourth\n", load_error=RuntimeError("kaboom"))
    note, line = err.splitlines()
    assert code == 1 and line.startswith("localchat: error: internal error: RuntimeError")
    assert Path(note.split("the piped text is kept in ")[1]).read_text() == "fourth\n"
    assert len(list(unsent.iterdir())) == 4


def test_ctrl_c_while_loading_without_a_history_keeps_the_piped_text(ask, home, monkeypatch,
                                                                     capsys):
    """A history that cannot be used cannot hold the message: the piped text goes to a file,
    named in the interrupted line (a trial lost it); ``--no-save`` still writes nothing."""
    def interrupted(options):
        raise KeyboardInterrupt

    ask(["first"], ["x"])  # creates the data folder
    (home / "data" / "history.db").write_bytes(b"\xff" * 8192)
    for args, kept in ((["review"], True), (["review", "--no-save"], False)):
        monkeypatch.setattr(ask_cmd, "load_engine", interrupted)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"piped text\n")))
        code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["ask", *args])
        last = capsys.readouterr().err.splitlines()[-1]
        assert code == 130
        files = list((home / "data" / "unsent").glob("*.txt")) if kept else []
        if kept:
            assert last == f"localchat: interrupted; the piped text is kept in {files[0]}"
            assert files[0].read_text() == "piped text\n"
        else:
            assert last == "localchat: interrupted"
    assert len(list((home / "data" / "unsent").glob("*.txt"))) == 1
