"""Cache keys of model files: which cached conversion belongs to which file (torch-free).

A GGUF file's converted metadata (config, tensor table, tokenizer) and repacked weights are
cached under ``<cache_dir>/<kind>/<gguf_cache_key>``. The key is cheap to compute (two MiB
read, no parse) and changes with the file and with the transformers version that converted
it, so a changed file or a new transformers re-converts instead of trusting old output.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_MIB = 1 << 20

# gguf_cache_key per (path, size, mtime, inode, transformers version): one load asks for the
# key of the same file some eight times (config, tensor table, tokenizer, weight cache)
_KEYS: dict[tuple, str] = {}


def gguf_cache_key(path: Path) -> str:
    """Cache key of a GGUF file's converted metadata (config, tensor table, tokenizer):
    ``<stem>-<16 hex>`` hashing its name, size, first and last MiB and the transformers
    version (the conversion's author), so a changed file or a new transformers re-converts.
    Computed once per process for a file whose size, mtime and inode stay the same."""
    path = Path(path)
    stat = path.stat()
    size = stat.st_size
    memo = (str(path.absolute()), size, stat.st_mtime_ns, stat.st_ino, transformers_version())
    key = _KEYS.get(memo)
    if key is not None:
        return key
    digest = hashlib.sha256(f"{path.name}|{size}|{transformers_version()}".encode())
    with open(path, "rb") as f:
        digest.update(f.read(_MIB))
        if size > 2 * _MIB:
            f.seek(size - _MIB)
        digest.update(f.read(_MIB))
    key = _KEYS[memo] = f"{path.stem}-{digest.hexdigest()[:16]}"
    return key


def meta_dir(path: Path, cache_dir: Path | None) -> Path | None:
    """``cache_dir/gguf-meta/<gguf_cache_key>``: converted metadata of one GGUF file (config,
    tensor table), or ``None`` without a cache folder."""
    return Path(cache_dir) / "gguf-meta" / gguf_cache_key(Path(path)) if cache_dir else None


@functools.cache
def transformers_version() -> str:
    """The installed transformers version, read from its package metadata: importing
    transformers itself costs seconds, and a cached load must not pay that. Read once per
    process (``transformers_version.cache_clear()`` after installing another)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "none"
