"""``localchat pull`` / ``ask -m`` / ``plan`` of Hub GGUF specs as subprocesses against the fake
Hub on 127.0.0.1 (``test_hub_gguf.py``'s repos): each command's lines and exit code, a real
GGUF pulled and then planned offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.engine.hub.test_download import env  # noqa: F401 - the subprocess environment
from tests.engine.hub.test_hub_gguf import hub, repo  # noqa: F401 - the fake Hub fixture


def tiny_gguf(tmp_path: Path) -> bytes:
    """A small but well-formed GGUF file (``pull`` reads its header and tensor table)."""
    import gguf
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("x", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def cli(env, *args, **extra):  # noqa: F811
    return subprocess.run([sys.executable, "-m", "localchat.app.cli", *args],
                          env={**env, **extra}, capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)


def error_line(proc) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("localchat: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0].removeprefix("localchat: error: ")


def test_cli_pull_ask_and_plan(env, hub, tmp_path):  # noqa: F811
    hub.repos["org/tiny-gguf"] = repo({"tiny-Q4_K_M.gguf": tiny_gguf(tmp_path)})
    plan = cli(env, "plan", "org/tiny-gguf:Q4_K_M")
    assert error_line(plan) == ("org/tiny-gguf:Q4_K_M is not downloaded yet; run "
                                "`localchat pull org/tiny-gguf:Q4_K_M`")
    plain = error_line(cli(env, "plan", "org/tiny-gguf"))  # no config.json to plan from
    assert plain.endswith("a GGUF repo is planned once pulled: `localchat pull org/tiny-gguf`)")
    pulled = cli(env, "pull", "hf.co/org/tiny-gguf:Q4_K_M")
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip())
    assert path.name == "tiny-Q4_K_M.gguf" and path.is_relative_to(tmp_path / "hf")
    assert "downloading hf.co/org/tiny-gguf:Q4_K_M" not in pulled.stderr  # the canonical name
    assert "downloading org/tiny-gguf:Q4_K_M from the Hugging Face Hub" in pulled.stderr
    hub.requests.clear()
    again = cli(env, "pull", "org/tiny-gguf", HF_HUB_OFFLINE="1")  # plain: its Q4_K_M
    assert (again.returncode, again.stdout) == (0, pulled.stdout)
    assert hub.requests == []
    assert "org/k has no Q4_K GGUF file" in error_line(cli(env, "pull", "org/k:Q4_K"))
    assert "split GGUF files are not supported" in error_line(
        cli(env, "ask", "-m", "org/split:Q4_K_M", "hi"))
    assert "nothing after ':'" in error_line(cli(env, "pull", "org/k:"))
    plain = cli(env, "pull", "org/k")  # a GGUF-only repo, online: no library line on stderr
    assert "downloading org/k from the Hugging Face Hub: x-Q4_K_M.gguf" in plain.stderr
    assert "No files matched" not in plain.stderr, plain.stderr


def test_cli_pull_then_plan_a_real_gguf(env, hub, smollm2_gguf):  # noqa: F811
    """The SmolLM2 bundle's GGUF (tests/conftest.py) served as a Hub repo's file: pull, then
    plan from the cache alone (its metadata read by the loader)."""
    data = smollm2_gguf.read_bytes()
    hub.repos["org/smol-gguf"] = repo({"SmolLM2-135M-Instruct.Q4_1.gguf": data, "README.md": b"#"})
    pulled = cli(env, "pull", "org/smol-gguf:q4_1")
    assert pulled.returncode == 0, pulled.stderr
    assert Path(pulled.stdout.strip()).stat().st_size == smollm2_gguf.stat().st_size
    hub.requests.clear()
    plan = cli(env, "plan", "org/smol-gguf:Q4_1", "--json", HF_HUB_OFFLINE="1")
    assert plan.returncode == 0, plan.stderr
    described = json.loads(plan.stdout)
    assert described["model"]["architecture"] == "LlamaForCausalLM"
    assert described["model"]["checkpoint_bytes"] == len(data)
    assert described["native"] is not None and hub.requests == []  # its own Q4_1 format
