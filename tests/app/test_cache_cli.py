"""``localchat cache show`` / ``prune`` on a private LOCALCHAT_HOME: what they list, what
prune removes (never the models, never this installation's kernel build)."""

from __future__ import annotations

import os
import time

import pytest

from localchat.app import cli, cli_io
from localchat.engine import cache_gc
from localchat.kernels.cpu.build import build_name

KEY = "Model-Q4-0123456789abcdef"


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    v = cache_gc.current_native_version()
    files = {
        "current": f"quant/{KEY}-native-panel-q8-g32-float32-v{v}.safetensors",
        "superseded": f"quant/{KEY}-native-g32-float32-v{v}.safetensors",
        "old_version": f"quant/{KEY}-native-g32-float32-v{int(v) - 1}.safetensors",
        "other_build": "kernels/cpu-torch0.0-py30-0000000000/lib.so",
        "this_build": f"kernels/{build_name()}/lib.so",
        "model": "models/m/m.gguf",
    }
    paths = {}
    for i, (name, rel) in enumerate(files.items()):
        path = home / "cache" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
        t = time.time() - 3600 * (len(files) - i)  # "current" the oldest but newest in use
        os.utime(path, (t, t))
        paths[name] = path
    os.utime(paths["current"])
    building = home / "cache" / "kernels" / f"{build_name()}.build-abc"  # a build in progress
    building.mkdir()
    (building / "a.o").write_bytes(b"o")
    paths["building"] = building / "a.o"
    return paths


def _run(capsys, *args):
    code = cli_io.run_cli(cli.typer.main.get_command(cli.app), ["cache", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_show_lists_each_entry_and_why_it_is_stale(home, capsys):
    code, out, err = _run(capsys, "show")
    assert code == 0
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert set(lines) == {home[k].name for k in ("current", "superseded", "old_version")} | {
        home[k].parent.name for k in ("other_build", "this_build", "building")}
    assert lines[home["building"].parent.name].endswith("in progress")
    assert lines[home["superseded"].name].endswith("superseded by a newer layout of the same "
                                                   "weights")
    assert "another build" in lines[home["other_build"].parent.name]
    assert lines[home["current"].name].split()[-1] == time.strftime("%Y-%m-%d")  # not stale
    assert err.startswith(f"localchat: note: {home['model'].parents[2]}: 5.0 kB in 6 entries "
                          "beside the models; 3.0 kB stale in 3 ('localchat cache prune'")


def test_prune_removes_the_stale_entries_only(home, capsys):
    code, out, err = _run(capsys, "prune", "--dry-run")
    assert code == 0 and len(out.splitlines()) == 3 and all(p.exists() for p in home.values())
    assert "would remove 3 entries, 3.0 kB" in err
    code, out, err = _run(capsys, "prune")
    assert code == 0 and "removed 3 entries, 3.0 kB freed" in err
    gone = {k for k, p in home.items() if not p.exists()}
    assert gone == {"superseded", "old_version", "other_build"}
    code, out, err = _run(capsys, "prune", "--all")
    assert code == 0 and "removed 2 entries" in err
    # models are never pruned, nor a build in progress
    assert [k for k, p in home.items() if p.exists()] == ["model", "building"]
