"""Startup order: help never imports torch; a prompt no context can hold fails before any
weight is loaded (checked in fresh processes, where ``sys.modules`` tells what was imported)."""

from __future__ import annotations

import re
import subprocess
import sys

_HELP = r"""
import sys
from localchat.app.cli import main
sys.argv = ["localchat", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""

_TOO_LONG = r"""
import sys
from localchat.app.load_options import LoadOptions
from localchat.app.prompt_check import check_prompt_before_load
from localchat.app.session import ChatSession
from localchat.engine.errors import ContextLengthError
session = ChatSession()
session.add_user("word " * 20000)
try:
    check_prompt_before_load(LoadOptions(model="smollm2-135m", draft=None, quant="auto",
                                         num_speculative_tokens=None), session, 16)
    print("NO-ERROR")
except ContextLengthError as err:
    print("ERROR", err)
# no engine was built (the loader package may be imported for the config, no weight read),
# and the check imported no torch (a cached config and tokenizer need none of it)
loaded = [m for m in ("localchat.engine.llm_engine", "localchat.engine.async_engine",
                      "localchat.app.engine_loader", "torch", "numpy", "transformers")
          if m in sys.modules]
print("LOADED", loaded)
"""


def test_help_does_not_import_torch():
    for args in (["--help"], ["ask", "--help"]):
        out = subprocess.run([sys.executable, "-c", _HELP, *args], capture_output=True,
                             text=True, timeout=120, check=False)
        assert "Usage" in out.stdout, out.stderr
        assert out.stdout.strip().splitlines()[-1] == "NO-TORCH", args


def test_too_long_prompt_fails_before_the_model_loads(smollm2_gguf, cache_dir):
    from localchat.engine.loader import load_model_config
    from localchat.engine.tokenizer import Tokenizer

    load_model_config(smollm2_gguf, cache_dir)  # the cached config and tokenizer the check
    Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache_dir)  # reads (as after a load)
    out = subprocess.run([sys.executable, "-c", _TOO_LONG], capture_output=True, text=True,
                         timeout=300, check=False)
    lines = out.stdout.strip().splitlines()
    assert lines and lines[-2].startswith("ERROR"), out.stderr[-2000:]
    # the 20,000 words are measured on a prefix (session._far_too_long): a lower bound on
    # their tokens, above the 8,191 the context leaves for a prompt
    counted = re.search(r"takes more than (\d+) tokens, more than the 8191 available", lines[-2])
    assert counted and 8191 < int(counted.group(1)) <= 20000, lines[-2]
    assert lines[-1] == "LOADED []"


_ASK_REMOTE = r"""
import sys
from localchat.app.cli import main
sys.argv = ["localchat", "ask", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in ("torch", "transformers", "numpy", "tokenizers", "textual", "pydantic",
                     "httpx", "localchat.engine.llm_engine", "localchat.engine.loader")
         if m in sys.modules]
print(f"EXIT {code} HEAVY {heavy}", file=sys.stderr)
"""


def test_ask_through_a_server_imports_no_torch(tmp_path):
    """An ``ask`` answered by an OpenAI-compatible server (here a fake one on 127.0.0.1, as
    a warm ``localchat serve`` answers) imports neither torch, transformers nor numpy."""
    import os

    from localchat.app import settings
    from tests.app.server.live import ServerThread
    from tests.app.server.test_ask_backend import fake_openai

    home = tmp_path / "home"
    home.mkdir()
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    app, seen = fake_openai()
    server = ServerThread(app).start()
    try:
        out = subprocess.run([sys.executable, "-c", _ASK_REMOTE, "--endpoint", server.url,
                              "--temperature", "0", "--max-tokens", "4", "Hi"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             env=env, timeout=300, check=False)
    finally:
        server.stop()
    assert out.stdout.strip() == "Hello world", out.stderr[-2000:]
    assert len(seen) == 1
    assert out.stderr.strip().splitlines()[-1] == "EXIT 0 HEAVY ['httpx']", out.stderr[-2000:]


def test_ask_through_a_warm_local_server_imports_only_the_client(tmp_path, monkeypatch):
    """A warm ``ask``: a server found through the runtime state file (a fake OpenAI server on
    127.0.0.1 that answers ``/health`` as ``localchat serve`` does) answers, and the client
    process imports none of torch, transformers, numpy, tokenizers, textual, the engine,
    pydantic (typer's value conversion, ``cli_coerce``) or httpx (``server/transport.py``);
    the question reached the server with the user's settings."""
    import os

    from localchat.app import settings
    from localchat.app.server import state
    from tests.app.server.live import ServerThread
    from tests.app.server.test_ask_backend import fake_openai

    home = tmp_path / "home"
    home.mkdir()
    (home / "cache").symlink_to(settings.cache_dir(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(home)
    app, seen = fake_openai()
    server = ServerThread(app).start()
    try:
        monkeypatch.setenv("LOCALCHAT_HOME", str(home))
        state.write_state(state.ServerInfo(url=server.url, model="fake-model"))
        out = subprocess.run([sys.executable, "-c", _ASK_REMOTE, "-m", "fake-model",
                              "--temperature", "0", "--max-tokens", "4", "--stop", "zz",
                              "Hi"], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, env=env, timeout=300, check=False)
    finally:
        server.stop()
    assert out.stdout.strip() == "Hello world", out.stderr[-2000:]
    (request,) = seen
    body = request["body"]
    assert body["model"] == "fake-model" and body["messages"][-1]["content"] == "Hi"
    assert body["max_tokens"] == 4 and body["temperature"] == 0 and body["stop"] == ["zz"]
    assert out.stderr.strip().splitlines()[-1] == "EXIT 0 HEAVY []", out.stderr[-2000:]


def test_resolving_a_model_imports_no_tqdm(smollm2_gguf):
    """The Hub download module (tqdm, ~20 ms) is imported only for a Hub snapshot: resolving
    an alias or a local file, what a too-long prompt or a server-backed ``ask`` pays before
    it answers, leaves it out."""
    code = (
        "import sys\nfrom localchat.app.settings import cache_dir\n"
        "from localchat.engine.hub.resolve import resolve_model\n"
        "resolve_model('smollm2-135m', cache_dir=cache_dir(), download=False)\n"
        f"resolve_model({str(smollm2_gguf)!r}, cache_dir=cache_dir(), download=False)\n"
        "print([m for m in ('tqdm', 'localchat.engine.hub.download') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


_INTERRUPTED_IMPORT = r"""
import sys


class Interrupt:  # Ctrl+C while the CLI's modules are imported: here, at typer's import
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, Interrupt())
from localchat.app.entry import main
sys.argv = ["localchat", "--help"]
main()
"""


def test_ctrl_c_while_the_cli_is_imported_is_one_line_and_130():
    out = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True,
                         text=True, timeout=120, check=False)
    assert (out.returncode, out.stderr, out.stdout) == (130, "localchat: interrupted\n", "")


def test_the_console_script_is_the_guarded_entry_point():
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="localchat")
    assert script.value == "localchat.app.entry:main"
