"""A first load that writes its weight cache from a thread (``QuantConfig.background_write``,
what the CLI asks for, so the first answer does not wait for the disk).

Checked on the real SmolLM2 GGUF, against the synchronous write as the reference: a process
that loads and exits at once (no explicit wait) leaves a complete cache entry, byte for byte
what the synchronous write gives (the same metadata and tensors; the header's key order
varies between processes), and a later load hits it; in one process, a second
load waits for the first one's write and hits it too. A temporary file of a write killed
long ago is removed by the next write; a recent one (another process's write in progress)
is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open

from localchat.engine.config import QuantConfig
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.quant import cache
from localchat.engine.quant.cache import NATIVE_FORMAT, cache_path

LOAD = """
import sys, torch
from pathlib import Path
from localchat.engine.config import QuantConfig
from localchat.engine.loader import load_model, load_model_config
path, folder = Path(sys.argv[1]), Path(sys.argv[2])
load_model(path, load_model_config(path, folder), dtype=torch.float32,
           device=torch.device("cpu"), max_position=256, cache_dir=folder,
           quant=QuantConfig(scheme="native", background_write=sys.argv[3] == "1"))
"""


def _load(path: Path, folder: Path, background: bool):
    return load_model(path, load_model_config(path, folder), dtype=torch.float32,
                      device=torch.device("cpu"), max_position=256, cache_dir=folder,
                      quant=QuantConfig(scheme="native", background_write=background))


def _entry(path: Path, folder: Path) -> Path:
    return cache_path(folder, path, "native", 32, torch.float32, NATIVE_FORMAT)


def test_a_process_that_exits_at_once_leaves_the_whole_entry(smollm2_gguf, tmp_path):
    written = {}
    for mode in ("0", "1"):
        folder = tmp_path / f"mode{mode}"
        subprocess.run([sys.executable, "-c", LOAD, str(smollm2_gguf), str(folder), mode],
                       check=True, timeout=600)
        entry = _entry(smollm2_gguf, folder)
        with safe_open(str(entry), framework="pt") as f:
            written[mode] = (f.metadata(), {k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
        assert not list(entry.parent.glob(f".{entry.name}.*"))  # no temporary file left
    (meta1, tensors1), (meta0, tensors0) = written["1"], written["0"]
    assert meta1 == meta0 and tensors1.keys() == tensors0.keys()
    assert all(torch.equal(tensors1[k], tensors0[k]) for k in tensors0)
    assert _load(smollm2_gguf, tmp_path / "mode1", background=True).quant_cache_hit


def test_a_second_load_in_the_process_waits_for_the_first_write(smollm2_gguf, tmp_path):
    first = _load(smollm2_gguf, tmp_path, background=True)
    assert not first.quant_cache_hit
    second = _load(smollm2_gguf, tmp_path, background=True)
    assert second.quant_cache_hit


def test_old_temporary_files_are_removed_recent_ones_kept(tmp_path):
    entry = tmp_path / "quant" / "m.safetensors"
    entry.parent.mkdir()
    old, recent = entry.parent / f".{entry.name}.old1", entry.parent / f".{entry.name}.new1"
    for f in (old, recent):
        f.write_bytes(b"partial")
    past = time.time() - cache.STALE_TMP_S - 60
    os.utime(old, (past, past))
    module = torch.nn.Linear(4, 2)
    cache.save_quantized(module, entry, {"scheme": "none"}, background=True)
    cache.wait_saved(entry)
    assert entry.is_file() and not old.exists() and recent.exists()


def test_waiting_for_every_write_joins_each_pending_one(tmp_path):
    """``wait_saved()`` without a path returns once every background write has finished:
    each entry then holds the module's tensors, read back with safetensors."""
    from safetensors.torch import load_file

    modules = [torch.nn.Linear(4, 2), torch.nn.Linear(3, 5)]
    entries = [tmp_path / "quant" / f"m{i}.safetensors" for i in range(2)]
    for module, entry in zip(modules, entries):
        cache.save_quantized(module, entry, {"scheme": "none"}, background=True)
    cache.wait_saved()
    assert not cache._PENDING
    for module, entry in zip(modules, entries):
        saved = load_file(str(entry))
        assert all(torch.equal(saved[k], v) for k, v in module.state_dict().items())
