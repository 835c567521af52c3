"""What localchat's cache folder holds beside the models, which of it is stale, and pruning it.

Loads write files derived from a model into the cache folder (``settings.cache_dir()``), and
rebuild any that is missing:

- ``quant/``: repacked weights (``quant/cache.py``), one file per model file, weight format,
  activation dtype and layout version (``...-v8.safetensors``); about the model's size each;
- ``kernels/``: builds of the C++ CPU kernels (``kernels/cpu/build.py``), one folder per
  torch version, Python ABI and source hash; a few MB each.

(``gguf-meta/`` and ``gguf-tokenizers/``, a few MB per model, are left out.)

Nothing removes them on its own, so they pile up: every upgrade that changes a layout writes
new repacked copies beside the old ones (a 1.5B model's are 1.1 GB each), every kernel change
a new build. An entry is stale when:

- it is a repacked file of another layout version than this localchat writes (an older or
  newer localchat's: this one never reads it), or one superseded: the same model file, weight
  format family (``native``, ``int4``...), group size and dtype, in another set of layouts
  (``native-panel-q6`` before ``native-panel-q6-q8``), used less recently than the other;
- it is a kernel build other than this installation's (another torch, Python or source);
- it is a repacked file not used for ``max_age_days``: loads :func:`touch` what they read, so
  the file of a model since deleted, or of a weight format no longer chosen, ages out.

:func:`mark_used` runs when a load reads or writes a repacked file (``quant/cache.py``): the
files it supersedes go once unused for a day, so an upgrade replaces rather than adds (and
two configurations in use side by side keep theirs).
Anything else is removed only by ``localchat cache prune``. The downloaded models
(``models/``) are never touched here. Reference design: Ollama prunes unreferenced blobs at
start; ``pip cache`` and ``huggingface-cli delete-cache`` prune on request (own code).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

DAY_S = 86400
MAX_AGE_DAYS = 30  # an entry unused this long is stale
TMP_AGE_S = 3600  # a write's temporary file or a build's scratch folder this old was stopped
DERIVED = ("quant", "kernels")  # folders of cache_dir()
# quant/ file names (quant/cache.py's cache_path): <model key>-<scheme>-g<group>-<dtype>[-v<N>]
# with <model key> = <name>-<16 hex>, <scheme> "native" plus the layouts in use (native-panel-
# q6-q8-q5), "int4", "int8"...
_QUANT_NAME = re.compile(r"^(?P<key>.+-[0-9a-f]{16})-(?P<family>[a-z0-9]+)(?:-[a-z0-9-]+)?"
                         r"-g(?P<group>\d+)-(?P<dtype>[a-z0-9]+)(?:-v(?P<version>\d+))?"
                         r"\.safetensors$")


@dataclass(frozen=True)
class CacheEntry:
    """One file or folder of a derived-cache folder: ``kind`` (the folder: ``quant``,
    ``kernels``...), ``path``, ``bytes`` (a folder's files summed), ``last_used`` (mtime,
    seconds since the epoch; :func:`touch` sets it on use), ``stale``: why it may go, or
    None, and ``busy``: a write or kernel build in progress (never stale, never removed)."""

    kind: str
    path: Path
    bytes: int
    last_used: float
    stale: str | None
    busy: bool = False  # a write or build in progress (a temporary name, recently changed)


def touch(path: Path) -> None:
    """Mark ``path`` (a cache file or folder) used now (its mtime; atime is often not kept).
    Never raises: a read-only cache only loses the record."""
    try:
        os.utime(path)
    except OSError:
        pass


def current_native_version() -> str:
    """The layout version in the names of the repacked files this localchat writes (``8``
    of ``quant.cache.NATIVE_FORMAT`` ``localchat-native-8``)."""
    from .quant.cache import NATIVE_FORMAT

    return NATIVE_FORMAT.rpartition("-")[2]


def scan(cache_dir: Path, *, kernel_build: str | None = None,
         max_age_days: float = MAX_AGE_DAYS, now: float | None = None) -> list[CacheEntry]:
    """Every entry of ``cache_dir``'s derived folders (:data:`DERIVED`), by kind then name.
    ``kernel_build``: the name of this installation's kernel build folder (any other is
    stale; None: no kernel build is). Raises nothing: an entry that vanishes while scanned
    is left out."""
    now = time.time() if now is None else now
    version = current_native_version()
    newest: dict[tuple, float] = {}  # the last use of each quant slot (key, family, group, dtype)
    for path in Path(cache_dir, "quant").glob("*.safetensors"):
        slot = _slot(path.name)
        try:
            if slot is not None:
                newest[slot] = max(newest.get(slot, 0.0), path.stat().st_mtime)
        except OSError:
            continue
    entries = []
    for kind in DERIVED:
        folder = Path(cache_dir) / kind
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = folder / name
            try:
                used = path.stat().st_mtime
                size = path_bytes(path)
            except OSError:
                continue
            why, busy = None, False
            match = _QUANT_NAME.match(name) if kind == "quant" else None
            temporary = name.startswith(".") if kind == "quant" else ".build-" in name
            if temporary:  # (quant/.<name>.*: a write; kernels/<build>.build-*: a build)
                busy = now - used <= TMP_AGE_S
                why = None if busy else ("an interrupted write" if kind == "quant"
                                         else "an interrupted build")
            elif match and match["version"] and match["version"] != version:
                why = f"layout v{match['version']} (this localchat reads v{version})"
            elif match and used < newest.get(_slot(name), used):
                why = "superseded by a newer layout of the same weights"
            elif kind == "kernels":
                if kernel_build is not None and name != kernel_build:
                    why = "another build (torch, Python or sources)"
            elif now - used > max_age_days * DAY_S:
                days = int((now - used) // DAY_S)
                why = f"unused for {days} days" if days else "unused for under a day"
            entries.append(CacheEntry(kind, path, size, used, why, busy))
    return entries


def remove(entries: list[CacheEntry]) -> list[CacheEntry]:
    """Delete ``entries`` (files, or folders with their files); returns those removed. An
    entry that cannot be removed (permissions, gone already) is skipped."""
    removed = []
    for entry in entries:
        try:
            if entry.path.is_dir() and not entry.path.is_symlink():
                shutil.rmtree(entry.path)
            else:
                entry.path.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def mark_used(path: Path, *, grace_s: float = DAY_S, now: float | None = None) -> int:
    """A load read (or wrote) the repacked file ``path``: :func:`touch` it, and remove the
    files it supersedes (the same model file, format family, group size and dtype under
    another name: other layouts, another layout version) that have not been used for
    ``grace_s`` seconds (a day: two configurations used side by side, as a test suite's,
    keep both). Returns the bytes freed. Raises nothing."""
    touch(path)
    slot = _slot(path.name)
    if slot is None:
        return 0
    now = time.time() if now is None else now
    stale = []
    for other in path.parent.glob(f"{glob.escape(slot[0])}-*.safetensors"):
        if other.name != path.name and _slot(other.name) == slot:
            try:
                st = other.stat()
            except OSError:
                continue
            if now - st.st_mtime > grace_s:
                stale.append(CacheEntry("quant", other, st.st_size, st.st_mtime, "superseded"))
    return sum(e.bytes for e in remove(stale))


def _slot(name: str) -> tuple[str, str, str, str] | None:
    """``(model key, format family, group, dtype)`` of a quant/ file name, or None."""
    m = _QUANT_NAME.match(name)
    return None if m is None else (m["key"], m["family"], m["group"], m["dtype"])


def path_bytes(path: Path) -> int:
    """Bytes of the file ``path``, or of the files under the folder ``path`` (a link counts as
    its target's size only when it is the path itself). Raises ``OSError``."""
    if path.is_dir() and not path.is_symlink():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
