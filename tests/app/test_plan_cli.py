"""``localchat plan``: the memory table, JSON, flags and errors.

In-process runs (``cli_io.run_cli``) plan tiny local HF folders and the real SmolLM2 GGUF; the
weight bytes are checked against the tensors stored in the checkpoint files (read with
``safetensors`` and ``gguf``, independently of the planner). One subprocess plans a repo on a
fake Hub (``HF_ENDPOINT``) and must fetch only ``config.json`` and safetensors headers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer

from localchat.app import cli_io
from localchat.app.cli import app
from tests.engine.hub.fake_hub_server import FakeHub, FakeRepo
from tests.engine.tiny_models import save_tiny_model

GiB = 2**30


@pytest.fixture(autouse=True)
def config_file(tmp_path, monkeypatch) -> Path:
    """``plan`` reads the settings ``ask`` reads: here only the ones a test writes to this
    file (none from the machine's own config.toml or LOCALCHAT_* variables)."""
    from localchat.app import settings

    path = tmp_path / "config.toml"
    monkeypatch.setattr(settings, "config_path", lambda: path)
    for key in settings.KEYS.values():
        monkeypatch.delenv(key.env, raising=False)
    return path


def run_plan(capsys, *args: str) -> tuple[int, str, str]:
    code = cli_io.run_cli(typer.main.get_command(app), ["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def stored_numel(folder: Path) -> int:
    """Values stored in a folder's safetensors files (the checkpoint's own count)."""
    from safetensors import safe_open

    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                total += math.prod(st.get_slice(name).get_shape())
    return total


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan-models")
    save_tiny_model("qwen2", root / "qwen2")
    save_tiny_model("llama", root / "llama")  # tied embeddings
    return root


def float_bytes(fmt: str) -> int:
    return {"fp32": 4, "bf16": 2}[fmt]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_json_weights_equal_the_stored_tensors(capsys, tiny_folders, arch):
    folder = tiny_folders / arch
    code, out, err = run_plan(capsys, str(folder), "--memory", "2GiB", "--context", "256",
                              "--device", "cpu", "--json")
    assert code == 0, err
    plan = json.loads(out)
    unquantized = plan["rows"][0]
    assert unquantized["format"] in ("fp32", "bf16")
    numel = stored_numel(folder)
    assert plan["model"]["parameters"] == numel
    assert unquantized["weight_bytes"] == numel * float_bytes(unquantized["format"])
    assert [r["format"] for r in plan["rows"]][1:] == ["int8", "int4"]
    assert plan["choice"]["format"] == unquantized["format"]  # a tiny model fits unquantized
    assert plan["budget_bytes"] == 2 * GiB and plan["requested_context_len"] == 256


def test_table_and_draft(capsys, tiny_folders):
    code, out, err = run_plan(capsys, str(tiny_folders / "qwen2"), "--draft",
                              str(tiny_folders / "llama"), "--memory", "4GiB", "--context", "512")
    assert code == 0, err
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("FORMAT"))
    assert lines[header].split() == ["FORMAT", "WEIGHTS", "KV", "DRAFT", "ACTIVATIONS",
                                     "RUNTIME", "TOTAL", "LEFT", "FITS"]
    rows = [ln.split() for ln in lines[header + 1: header + 4]]
    assert [r[0] for r in rows][1:] == ["int8", "int4"] and all(r[-1] == "yes" for r in rows)
    assert any(ln.startswith("choice:  " + rows[0][0] + " at 512 tokens") for ln in lines)
    assert any(ln.startswith("draft:") for ln in lines)
    code, out, _ = run_plan(capsys, str(tiny_folders / "qwen2"), "--draft",
                            str(tiny_folders / "llama"), "--memory", "4GiB", "--json")
    row = json.loads(out)["rows"][0]
    draft_numel = stored_numel(tiny_folders / "llama")
    assert row["draft_weight_bytes"] == draft_numel * float_bytes(row["format"])
    assert row["draft_kv_bytes"] > 0


def test_a_draft_that_is_the_model_is_refused_as_ask_refuses_it(capsys, tiny_folders,
                                                                 tmp_path):
    model = tiny_folders / "qwen2"
    link = tmp_path / "link"
    link.symlink_to(model)
    for draft in (model, link):
        code, out, err = run_plan(capsys, str(model), "--draft", str(draft), "--memory", "4GiB")
        assert (code, out) == (2, "")
        assert err == f"localchat: error: --draft {draft}: the draft is the model itself\n"


def test_draft_and_quant_settings_are_planned_as_ask_loads_them(capsys, tiny_folders,
                                                                 config_file, monkeypatch):
    """The ``draft`` and ``quant`` settings (config.toml, LOCALCHAT_*) are what ``ask`` and
    ``serve`` load, so ``plan`` plans them, names them in its errors, and a flag wins."""
    model, draft = str(tiny_folders / "qwen2"), str(tiny_folders / "llama")
    config_file.write_text(f'draft = "{draft}"\nquant = "int8"\n')
    code, out, err = run_plan(capsys, model, "--memory", "4GiB", "--json")
    plan = json.loads(out)
    assert code == 0, err
    assert plan["choice"]["format"] == "int8" and plan["choice"]["draft_weight_bytes"] > 0
    code, out, _ = run_plan(capsys, model, "--memory", "4GiB", "--json", "--quant", "int4")
    assert json.loads(out)["choice"]["format"] == "int4"
    config_file.write_text('draft = "bogus"\n')
    code, out, err = run_plan(capsys, model, "--memory", "4GiB")
    assert (code, out) == (1, "") and err.startswith("localchat: error: draft (config.toml): ")
    config_file.write_text("")
    monkeypatch.setenv("LOCALCHAT_QUANT", "fp8")
    code, out, err = run_plan(capsys, model, "--memory", "4GiB", "--device", "cpu")
    assert (code, out) == (1, "") and err.startswith("localchat: error: LOCALCHAT_QUANT fp8: ")


def test_draft_auto_plans_the_catalog_draft(capsys, tiny_folders, monkeypatch):
    """``--draft auto`` plans the catalog's natural draft for the model, as ``ask`` loads it
    (``engine_loader.draft_spec``); a model the catalog pairs with none gets one error line
    and exit 2, as any bad flag value does."""
    from localchat.engine.hub import catalog

    target, draft = str(tiny_folders / "qwen2"), str(tiny_folders / "llama")
    code, out, err = run_plan(capsys, target, "--draft", "auto", "--memory", "4GiB")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("localchat: error: --draft auto: no natural draft model is known")
    entry = dataclasses.replace(next(iter(catalog.CATALOG.values())), draft=draft)
    monkeypatch.setattr(catalog, "resolve_alias", lambda name: entry if name == target else None)
    code, auto, err = run_plan(capsys, target, "--draft", "auto", "--memory", "4GiB", "--json")
    code2, named, _ = run_plan(capsys, target, "--draft", draft, "--memory", "4GiB", "--json")
    assert (code, code2, err) == (0, 0, "")
    assert json.loads(auto) == json.loads(named)
    assert json.loads(auto)["draft"] is not None


def test_real_gguf_weights(capsys, smollm2_gguf):
    import gguf

    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu", "--json")
    assert code == 0, err
    plan = json.loads(out)
    numel = sum(int(t.n_elements) for t in gguf.GGUFReader(str(smollm2_gguf)).tensors)
    row = plan["rows"][0]
    assert row["weight_bytes"] == numel * float_bytes(row["format"])
    assert plan["model"]["checkpoint_bytes"] == smollm2_gguf.stat().st_size
    assert plan["model"]["checkpoint_local"] is True
    # a file already here is not a download
    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu")
    assert code == 0, err
    size = cli_io.human_size(smollm2_gguf.stat().st_size)
    assert f"parameters, on disk {size})" in out.splitlines()[0], out
    # int4 from a GGUF uses the loader's 32-weight groups (llama.cpp's block size)
    from localchat.engine.loader import load_model_config
    from localchat.engine.memory.footprint import weight_bytes

    assert plan["model"]["int4_group_size"] == 32
    config = load_model_config(smollm2_gguf)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[row["format"]]
    assert plan["rows"][-1]["weight_bytes"] == weight_bytes(
        config, "int4", "cpu", dtype, group_size=32)


def test_hypothetical_cuda_needs_memory(capsys, tiny_folders):
    spec = str(tiny_folders / "qwen2")
    code, out, err = run_plan(capsys, spec, "--device", "cuda", "--json")
    if torch.cuda.is_available():
        assert code == 0 and json.loads(out)["device"]["type"] == "cuda"
    else:
        assert (code, out) == (2, "")
        assert err.strip() == ("localchat: error: no CUDA device on this machine; "
                               "pass --memory SIZE to plan for one")
    code, out, err = run_plan(capsys, spec, "--device", "cuda", "--memory", "24GiB", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["choice"]["format"] == "bf16"
    assert plan["device"]["hypothetical"] is not torch.cuda.is_available()


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--memory", "12 parsecs"], 2, "--memory: invalid size"),
    (["--quant", "int3"], 2, "--quant int3"),
    (["--context", "0"], 2, "--context 0: the context must hold at least 2 tokens"),
    (["--context", "1"], 2, "--context 1: the context must hold at least 2 tokens"),
    (["--max-num-seqs", "0"], 2, "--max-num-seqs 0: must be between 1 and 256"),
    (["--max-num-seqs", "100000"], 2, "--max-num-seqs 100000: must be between 1 and 256"),
    (["--device", "tpu"], 2, "--device tpu"),
    (["--memory", "100MiB"], 1, "no format fits in 0.10 GiB: int4 needs"),
    (["--memory", "600MiB", "--quant", "fp8"], 2, "--quant fp8: needs a CUDA GPU"),
])
def test_errors_are_one_line(capsys, tiny_folders, args, code, needle):
    got, out, err = run_plan(capsys, str(tiny_folders / "qwen2"), "--device", "cpu", *args)
    assert (got, out) == (code, "")
    assert err.count("\n") == 1 and err.startswith("localchat: error: ") and needle in err


def test_a_too_long_context_setting_is_a_runtime_error_as_ask_says_it(capsys, tiny_folders,
                                                                       monkeypatch):
    """The same context refused from a setting (LOCALCHAT_CONTEXT) exits 1, as ``ask`` does;
    from the flag it is a usage error (2)."""
    monkeypatch.setenv("LOCALCHAT_CONTEXT", "99999999")
    code, out, err = run_plan(capsys, str(tiny_folders / "qwen2"), "--device", "cpu")
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert err.startswith("localchat: error: LOCALCHAT_CONTEXT 99999999: ")
    code, out, err = run_plan(capsys, str(tiny_folders / "qwen2"), "--device", "cpu",
                              "--context", "99999999")
    assert (code, out) == (2, "") and err.startswith("localchat: error: --context 99999999: ")


def test_missing_model(capsys, tmp_path):
    code, out, err = run_plan(capsys, str(tmp_path / "absent.gguf"))
    assert (code, out) == (1, "") and "no such file or folder" in err


def test_plan_on_a_fresh_machine_builds_no_kernels_and_predicts_their_layouts(
        capsys, tmp_path, tiny_folders):
    """``plan`` sizes the int4 layout by whether localchat's C++ kernels will run; on a fresh
    machine (an empty ``LOCALCHAT_HOME``) it predicts that instead of building them (minutes):
    no library appears, and the plan equals the one made where the kernels are loaded."""
    from localchat.kernels import cpu

    folder = tiny_folders / "qwen2"
    env = dict(os.environ, LOCALCHAT_HOME=str(tmp_path / "lc"))
    proc = subprocess.run([sys.executable, "-m", "localchat.app.cli", "plan", str(folder),
                           "--memory", "2GiB", "--device", "cpu", "--json"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "building" not in proc.stderr
    assert not list((tmp_path / "lc").rglob("*.so"))
    cpu.available()  # here: the kernels as they really are (built, or not buildable)
    code, out, _ = run_plan(capsys, str(folder), "--memory", "2GiB", "--device", "cpu",
                            "--json")
    assert code == 0 and json.loads(proc.stdout) == json.loads(out)


def test_hub_repo_plans_from_config_and_headers_only(tmp_path, tiny_folders):
    """A Hub repo is planned from config.json and the safetensors header (HTTP ranges); the
    weights themselves are never downloaded."""
    folder = tiny_folders / "qwen2"
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    weights = files["model.safetensors"] + b"\0" * 2_000_000  # a body far past the header
    files["model.safetensors"] = weights
    with FakeHub() as hub:
        repo = FakeRepo()
        repo.add_commit(files, "main")
        hub.repos["org/tiny-qwen2"] = repo
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"),
                   LOCALCHAT_HOME=str(tmp_path / "lc"), HF_HUB_DISABLE_TELEMETRY="1")
        proc = subprocess.run(
            [sys.executable, "-m", "localchat.app.cli", "plan", "org/tiny-qwen2", "--memory",
             "2GiB", "--device", "cpu", "--json"],
            env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        numel = stored_numel(folder)
        assert plan["model"]["checkpoint_parameters"] == numel == plan["model"]["parameters"]
        assert plan["model"]["checkpoint_dtypes"] == {"F32": numel}
        assert plan["model"]["checkpoint_local"] is False
        assert {p.rsplit("/", 1)[1] for m, p, _ in hub.requests
                if m == "GET" and "/resolve/" in p} <= {"config.json", "model.safetensors"}
        ranges = [h.get("range") for m, p, h in hub.requests
                  if m == "GET" and p.endswith("/model.safetensors")]
        assert ranges and None not in ranges
        for r in ranges:
            first, last = r.removeprefix("bytes=").split("-")
            assert int(last) - int(first) < len(weights) // 10  # the header, not the body


def test_auto_choice_is_what_the_engine_loads(capsys, smollm2_gguf, cache_dir):
    """``plan``'s choice under ``auto`` names the format ``LLMEngine.from_path`` resolves
    ``auto`` to (``engine_build.resolve_auto_quant``), the GGUF's own format included."""
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine_build import resolve_auto_quant
    from localchat.engine.loader import load_model_config

    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu", "--json")
    assert code == 0, err
    plan = json.loads(out)
    config = load_model_config(smollm2_gguf, cache_dir)
    resolved, _ = resolve_auto_quant(smollm2_gguf, config, EngineConfig(device="cpu"), 2048,
                                     cache_dir)
    scheme = resolved.quant.scheme
    assert plan["loads"] == (scheme if scheme == "native" else plan["choice"]["format"])
    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu")
    choice = next(ln for ln in out.splitlines() if ln.startswith("choice:"))
    assert choice.startswith(f"choice:  {plan['loads']} at 2048 tokens"), choice


def test_quant_native(capsys, smollm2_gguf, tiny_folders):
    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu", "--quant", "native")
    assert code == 0, err
    assert any(ln.startswith("choice:  native at 2048 tokens (forced")
               for ln in out.splitlines()), out
    code, out, err = run_plan(capsys, str(tiny_folders / "qwen2"), "--memory", "2GiB",
                              "--quant", "native")
    assert code == 2 and "not a local GGUF" in err


def test_native_line_says_why_auto_skips_it_for_a_draft_that_is_no_gguf(capsys, smollm2_gguf,
                                                                        tiny_folders):
    """A GGUF with an HF-folder draft: auto loads the planner's choice for both (the draft has
    no native form), and the native line says so instead of promising auto's pick."""
    code, out, err = run_plan(capsys, str(smollm2_gguf), "--draft", str(tiny_folders / "llama"),
                              "--memory", "4GiB", "--context", "2048", "--device", "cpu")
    assert code == 0, err
    lines = out.splitlines()
    native = next(ln for ln in lines if ln.startswith("native:"))
    choice = next(ln for ln in lines if ln.startswith("choice:"))
    assert "not auto's pick: the draft is no GGUF" in native, native
    assert not choice.startswith("choice:  native"), choice
    code, out, err = run_plan(capsys, str(smollm2_gguf), "--memory", "4GiB", "--context",
                              "2048", "--device", "cpu")
    assert code == 0, err
    assert "auto's pick when it is no bigger than the choice" in out, out
