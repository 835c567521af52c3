"""Input and output hygiene of ``ask`` and ``chat --jsonl`` (issue 18), in subprocesses on the
fake engine (``fake_cli.py``): invalid UTF-8 arguments and lines, ``-x`` with and without both
fences, usage errors found before any model loads. stdout and stderr are checked apart."""

from __future__ import annotations

import json

from .test_cli_fake import env, fake, seen_prompt  # noqa: F401 - env is a fixture


def test_invalid_utf8_prompt_argument_is_replaced_with_a_warning_before_loading(env):
    proc = fake(env, "ask", b"caf\xe9 ok", FAKE_LOAD_SECONDS="0.01")
    assert proc.returncode == 0 and proc.stdout == b"Hello world\n"
    err = proc.stderr.decode().splitlines()
    assert err == ["localchat: warning: the argument 'caf\ufffd ok' is not valid UTF-8; invalid "
                   "bytes were replaced with U+FFFD", "loading"]  # warned before the model loads
    assert seen_prompt(env) == "user:caf\ufffd ok|assistant:"
    piped = fake(env, "ask", stdin=b"caf\xe9 ok")  # the same words as for stdin
    assert piped.stderr.decode().rstrip().split("stdin")[1] == err[0].split("ok'")[1]


def test_invalid_utf8_in_any_argument_is_replaced_with_a_warning(env):
    """Not only the prompt: a system prompt, a history query, a config value (each was an
    internal error: a tokenizer, SQLite and the TOML writer take no lone surrogates)."""
    proc = fake(env, "ask", "-s", b"sys\xff", "hi", FAKE_LOAD_SECONDS="0.01")
    assert proc.returncode == 0 and proc.stdout == b"Hello world\n", proc.stderr
    assert proc.stderr.decode().splitlines()[0] == (
        "localchat: warning: the argument 'sys\ufffd' is not valid UTF-8; invalid bytes were "
        "replaced with U+FFFD")
    assert seen_prompt(env) == "system:sys\ufffd|user:hi|assistant:"
    for args in (["history", "search", b"\xff"], ["config", "set", "system_prompt", b"x\xffy"]):
        proc = fake(env, *args)
        assert proc.returncode == 0, proc.stderr
        assert b"internal error" not in proc.stderr and b"warning: the argument" in proc.stderr
    shown = fake(env, "config", "show")
    assert "x\ufffdy" in shown.stdout.decode()


def test_jsonl_lone_surrogate_and_invalid_utf8_lines_get_an_error_and_the_session_goes_on(env):
    script = b"\n".join([
        b'{"role": "user", "content": "bad \\ud800 text"}',
        b'{"role": "user", "content": "caf\xe9"}',
        json.dumps({"role": "user", "content": "fine"}).encode(),
    ]) + b"\n"
    proc = fake(env, "chat", "--jsonl", stdin=script, FAKE_REPLY="Reply.")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(out) == 3
    assert "U+D800" in out[0]["error"] and "not valid Unicode" in out[0]["error"]
    assert out[1]["error"] == "'content' is not valid UTF-8: byte 0xE9 at character 3"
    assert out[2]["content"] == "Reply." and seen_prompt(env) == "user:fine|assistant:"


def test_extract_needs_both_fences_else_the_note(env):
    reply = "echo hi\n```\nThat prints hi."  # the opening fence is missing
    proc = fake(env, "ask", "-x", "script", FAKE_REPLY=reply)
    assert proc.returncode == 0
    assert proc.stdout.decode() == reply + "\n"  # the answer whole, never a false "block"
    assert proc.stderr.decode() == ("localchat: note: the answer has no complete fenced code "
                                    "block; printing it whole\n")
    proc = fake(env, "ask", "-x", "script", FAKE_REPLY="Run:\n```sh\nls -l\n```\nDone.")
    assert proc.stdout == b"ls -l\n" and proc.stderr == b""


def test_extract_with_json_prints_no_note(env):
    proc = fake(env, "ask", "-x", "--json", "q", FAKE_REPLY="no code here")
    assert proc.returncode == 0 and proc.stderr == b""
    assert json.loads(proc.stdout)["content"] == "no code here"


def test_json_keeps_the_exact_text_on_a_non_utf8_stdout(env):
    """``PYTHONIOENCODING=ascii localchat ask --json`` printed ``"Emoji ? and caf?"``
    without a word: the JSON of ``ask --json`` and ``chat --jsonl`` now escapes what the
    stream cannot encode (``\\uXXXX``), so a JSON reader gets the reply exactly."""
    reply = "Emoji \U0001f436 and caf\u00e9"
    for extra in ({"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"}, {}):
        proc = fake(env, "ask", "--json", "q", FAKE_REPLY=reply, **extra)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["content"] == reply
        chat = fake(env, "chat", "--jsonl", stdin=b'{"role":"user","content":"q"}\n',
                    FAKE_REPLY=reply, **extra)
        assert json.loads(chat.stdout.splitlines()[0])["content"] == reply
    assert "\U0001f436".encode() in proc.stdout  # UTF-8 as it is


def test_empty_conversation_id_is_a_usage_error(env):
    proc = fake(env, "ask", "--conversation", "", "hi", FAKE_LOAD_SECONDS="0.01")
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("localchat: error: --conversation needs")


def test_fp8_without_a_capable_gpu_is_a_usage_error_before_loading(env):
    from localchat.engine.quant.schemes import fp8_supported

    proc = fake(env, "ask", "--quant", "fp8", "hi", FAKE_LOAD_SECONDS="0.01")
    if fp8_supported("cuda"):  # a GPU of compute capability >= 8.9 takes it
        assert proc.returncode == 0
        return
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "loading" not in err
    assert err.startswith("localchat: error: --quant fp8: needs a CUDA GPU")


def test_history_prints_control_characters_escaped_and_export_json_keeps_them(env):
    from .test_cli_fake import db

    evil = "Title \x1b]0;pwned\x07 here"
    reply = "clear \x1b[2J screen\x9b and\ttab"
    assert fake(env, "ask", evil, FAKE_REPLY=reply).returncode == 0
    with db(env) as store:
        cid = store.most_recent().id
    for args in (["history", "list"], ["history", "show", cid], ["history", "search", "clear"]):
        proc = fake(env, *args)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.decode()
        assert not any(c in out for c in "\x1b\x07\x9b"), args
    shown = fake(env, "history", "show", cid).stdout.decode()
    assert "clear \\x1b[2J screen\\x9b and\ttab" in shown and "\\x1b]0;pwned\\x07" in shown
    assert "Title \\x1b]0;pwned\\x07 here" in fake(env, "history", "list").stdout.decode()
    exported = json.loads(fake(env, "history", "export", cid, "--format", "json").stdout)
    assert [m["content"] for m in exported["messages"]] == [evil, reply]


def test_endless_stdin_is_refused_after_a_bounded_read(env):
    """``yes | localchat ask ...`` read stdin to an end that never came, 300 MB a second,
    until the system killed it without a word. Now at most ``MAX_STDIN_BYTES`` are read:
    one line, exit 1, and the process's peak memory above a small stdin's by less than
    twice that bound."""
    import subprocess
    import sys

    from localchat.app.cli_input import MAX_STDIN_BYTES

    from .test_cli_fake import FAKE_CLI

    peak = ("import resource, runpy, sys; sys.argv = sys.argv[1:]\ntry: runpy.run_path("
            "sys.argv[0], run_name='__main__')\nfinally: print(resource.getrusage("
            "resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)")

    def ask(stdin):
        return subprocess.run([sys.executable, "-c", peak, str(FAKE_CLI), "ask", "summarize"],
                              stdin=stdin, capture_output=True, env=env, timeout=120,
                              check=False)

    small = ask(subprocess.DEVNULL)
    assert small.returncode == 0, small.stderr
    writer = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        proc = ask(writer.stdout)
    finally:
        writer.kill()
        writer.wait()
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 1 and len(err) == 2, err
    assert err[0] == (f"localchat: error: stdin holds more than {MAX_STDIN_BYTES >> 20} MiB, "
                      "more text than any model's context; cut it first (e.g. with 'head -c "
                      "1000000')")
    grown = int(err[1]) - int(small.stderr.decode().strip().splitlines()[-1])
    assert grown < 2 * MAX_STDIN_BYTES, grown
