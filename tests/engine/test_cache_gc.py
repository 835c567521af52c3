"""The cache folder's housekeeping (``engine/cache_gc.py``): which repacked files and kernel
builds are stale and why, what pruning removes, and the loaders marking what they read."""

from __future__ import annotations

import os
import time
from pathlib import Path

from localchat.engine import cache_gc

KEY = "Model-Q4-0123456789abcdef"
DAY = cache_gc.DAY_S


def _file(path: Path, age_s: float, size: int = 100, now: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    t = (time.time() if now is None else now) - age_s
    os.utime(path, (t, t))
    return path


def test_each_stale_rule_and_what_stays(tmp_path):
    now = time.time()
    v = cache_gc.current_native_version()
    q = tmp_path / "quant"
    newer = _file(q / f"{KEY}-native-panel-q6-q8-g32-float32-v{v}.safetensors", 60, now=now)
    older = _file(q / f"{KEY}-native-panel-q6-g32-float32-v{v}.safetensors", 2 * DAY, now=now)
    other_version = _file(q / f"{KEY}-native-g32-float32-v{int(v) - 1}.safetensors", 3600,
                          now=now)
    unused = _file(q / f"{KEY}-native-panel-q6-g32-bfloat16-v{v}.safetensors", 40 * DAY,
                   now=now)
    int4 = _file(q / f"{KEY}-int4-g32-float32.safetensors", 10 * DAY, now=now)
    tmp = _file(q / f".{newer.name}.k3j2", 2 * 3600, now=now)
    young_tmp = _file(q / f".{older.name}.a8x1", 60, now=now)  # (another write in progress)
    this_build = _file(tmp_path / "kernels" / "cpu-this" / "lib.so", 50 * DAY, 7, now=now)
    other_build = _file(tmp_path / "kernels" / "cpu-old" / "lib.so", 60, 5, now=now)
    building = tmp_path / "kernels" / "cpu-this.build-x1"  # a build in progress (its scratch)
    died = tmp_path / "kernels" / "cpu-other.build-y2"  # one stopped two hours ago
    for folder, age in ((building, 60), (died, 2 * 3600)):
        _file(folder / "a.o", age, now=now)
        os.utime(folder, (now - age, now - age))
    (tmp_path / "models").mkdir()
    _file(tmp_path / "models" / "m" / "m.gguf", 90 * DAY, now=now)  # never listed
    entries = cache_gc.scan(tmp_path, kernel_build="cpu-this", now=now)
    why = {e.path: e.stale for e in entries}
    assert set(why) == {newer, older, other_version, unused, int4, tmp, young_tmp,
                        this_build.parent, other_build.parent, building, died}
    assert why[newer] is None and why[int4] is None
    busy = {e.path for e in entries if e.busy}
    assert busy == {young_tmp, building} and why[young_tmp] is None and why[building] is None
    assert why[died] == "an interrupted build"
    assert why[older] == "superseded by a newer layout of the same weights"
    assert why[other_version] == f"layout v{int(v) - 1} (this localchat reads v{v})"
    assert why[unused] == "unused for 40 days"
    assert why[tmp] == "an interrupted write"
    assert why[this_build.parent] is None  # the build in use never ages out
    assert why[other_build.parent] == "another build (torch, Python or sources)"
    sizes = {e.path: e.bytes for e in entries}
    assert sizes[other_build.parent] == 5 and sizes[newer] == 100


def test_remove_deletes_files_and_folders_and_counts_what_it_freed(tmp_path):
    a = _file(tmp_path / "quant" / "a.safetensors", 0, 30)
    b = _file(tmp_path / "kernels" / "cpu-x" / "lib.so", 0, 12)
    gone = tmp_path / "quant" / "gone.safetensors"
    entries = [cache_gc.CacheEntry("quant", a, 30, 0.0, "x"),
               cache_gc.CacheEntry("kernels", b.parent, 12, 0.0, "x"),
               cache_gc.CacheEntry("quant", gone, 99, 0.0, "x")]
    removed = cache_gc.remove(entries)
    assert (len(removed), sum(e.bytes for e in removed)) == (2, 42)
    assert [e.path for e in removed] == [a, b.parent]  # the gone one skipped
    assert not a.exists() and not b.parent.exists()


def test_mark_used_touches_and_drops_what_it_supersedes_after_a_day(tmp_path):
    now = time.time()
    v = cache_gc.current_native_version()
    q = tmp_path / "quant"
    used = _file(q / f"{KEY}-native-panel-q6-q8-g32-float32-v{v}.safetensors", 5 * DAY, now=now)
    stale = _file(q / f"{KEY}-native-panel-q6-g32-float32-v{v}.safetensors", 2 * DAY, 40,
                  now=now)
    old_version = _file(q / f"{KEY}-native-g32-float32-v{int(v) - 1}.safetensors", 3 * DAY, 2,
                        now=now)
    recent = _file(q / f"{KEY}-native-g32-float32-v{v}.safetensors", 3600, now=now)
    bf16 = _file(q / f"{KEY}-native-g32-bfloat16-v{v}.safetensors", 9 * DAY, now=now)
    other_model = _file(q / f"Other-fedcba9876543210-native-g32-float32-v{v}.safetensors",
                        9 * DAY, now=now)
    assert cache_gc.mark_used(used, now=now) == 42
    assert not stale.exists() and not old_version.exists()
    assert recent.exists() and bf16.exists() and other_model.exists()  # in use / other slots
    assert used.stat().st_mtime > now - 60


def test_the_loaders_mark_the_file_they_read(smollm2_gguf, tmp_path):
    """A cached load of SmolLM2 (the repacked file written by the first load) touches that
    file and removes a same-slot file in another layout unused for two days."""
    from localchat.engine.config import EngineConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", scheduler=SchedulerConfig(max_model_len=256))
    from localchat.engine.quant.cache import wait_saved

    LLMEngine.from_path(smollm2_gguf, config, cache_dir=tmp_path)
    wait_saved()  # (the first load writes the repacked file in the background)
    (entry,) = sorted((tmp_path / "quant").glob("*.safetensors"))
    slot = cache_gc._slot(entry.name)
    assert slot is not None and slot[1] == "native"
    rival = entry.with_name(entry.name.replace(f"-{slot[1]}", f"-{slot[1]}-rival", 1))
    assert cache_gc._slot(rival.name) == slot
    _file(rival, 2 * DAY)
    past = time.time() - 5 * DAY
    os.utime(entry, (past, past))
    LLMEngine.from_path(smollm2_gguf, config, cache_dir=tmp_path)
    assert entry.stat().st_mtime > time.time() - 600
    assert not rival.exists()
