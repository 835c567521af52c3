"""What is wrong with a model file or folder, said in one line before anything loads (issue
18): corrupt GGUF metadata (never transformers' "not a valid JSON file"), a folder holding only
config.json (never a sentencepiece/tiktoken hint). Real entry point in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.engine.tiny_models import save_tiny_model


def ask(tmp_path, model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(tmp_path / "home")
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", "ask", "-m", str(model),
                           "--no-save", "hi"], stdin=subprocess.DEVNULL, capture_output=True,
                          env=env, timeout=600, check=False)


@pytest.mark.parametrize("offset", [8, 60, 1000])  # tensor count, first key, a vocab string
def test_corrupt_gguf_metadata_says_the_metadata_is_corrupt(smollm2_gguf, tmp_path, offset):
    bad = tmp_path / "bad.gguf"
    shutil.copyfile(smollm2_gguf, bad)
    with open(bad, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 16)
    proc = ask(tmp_path, bad)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and proc.stdout == b"" and err.count("\n") == 1, err
    assert err.startswith(f"localchat: error: cannot read GGUF file {bad}: ")
    assert "metadata is corrupt" in err and "JSON" not in err


def test_folder_with_only_config_json_says_what_it_lacks(tmp_path):
    folder = tmp_path / "model"
    save_tiny_model("llama", folder)
    for f in folder.iterdir():
        if f.name != "config.json":
            f.unlink()
    proc = ask(tmp_path, folder)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode() == (
        f"localchat: error: model folder {folder} is incomplete: it lacks weights (no "
        "*.safetensors file) and a tokenizer (no tokenizer.json or tokenizer.model)\n")


def test_a_gguf_named_otherwise_is_read_as_gguf(smollm2_gguf, tmp_path):
    """A GGUF whose name does not end in .gguf (``model.bin``) is taken by its magic, in
    every place that decides (resolve, loader, plan, cache key): the same greedy reply as the
    .gguf file itself."""
    from localchat.engine.loader import is_gguf

    named = tmp_path / "model.bin"
    shutil.copyfile(smollm2_gguf, named)
    text = tmp_path / "notes.bin"
    text.write_text("a text file, not a model\n")
    assert is_gguf(named) and is_gguf(smollm2_gguf) and not is_gguf(text)
    assert not is_gguf(tmp_path) and not is_gguf(tmp_path / "missing.bin")
    env = {k: v for k, v in os.environ.items() if k != "LOCALCHAT_ENDPOINT"}

    def reply(model):
        proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "ask", "-m",
                               str(model), "--local", "--no-save", "--temperature", "0",
                               "--max-tokens", "6", "What is the capital of France?"],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout

    assert reply(named) == reply(smollm2_gguf) != b""


def test_pull_of_a_truncated_local_gguf_fails_as_ask_does(smollm2_gguf, tmp_path):
    """``pull`` of a local file checks it loads (header and tensor table against the file's
    size): a truncated GGUF is one error line and exit 1, the same line ``ask`` gives, never
    its path and exit 0; the whole file is its path and exit 0."""
    cut = tmp_path / "cut.gguf"
    data = smollm2_gguf.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env["LOCALCHAT_HOME"] = str(tmp_path / "home")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "localchat.app.cli", *args],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              timeout=600, check=False)

    pulled, asked = run("pull", str(cut)), ask(tmp_path, cut)
    err = pulled.stderr.decode()
    assert pulled.returncode == 1 and pulled.stdout == b"" and err.count("\n") == 1, err
    assert "truncated at tensor" in err and err == asked.stderr.decode()
    whole = run("pull", str(smollm2_gguf))
    assert whole.returncode == 0 and whole.stdout.decode().strip() == str(smollm2_gguf)
