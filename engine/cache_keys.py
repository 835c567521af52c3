"""Cache keys of model files: which cached conversion belongs to which file (torch-free).

A GGUF file's converted metadata (config, tensor table, tokenizer) and repacked weights are
cached under ``<cache_dir>/<kind>/<gguf_cache_key>``. The key is cheap to compute (two MiB
read, no parse) and changes with the file and with the transformers version that converted
it, so a changed file or a new transformers re-converts instead of trusting old output.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_MIB = 1 << 20


def gguf_cache_key(path: Path) -> str:
    """Cache key of a GGUF file's converted metadata (config, tensor table, tokenizer):
    ``<stem>-<16 hex>`` hashing its name, size, first and last MiB and the transformers
    version (the conversion's author), so a changed file or a new transformers re-converts."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}|{size}|{transformers_version()}".encode())
    with open(path, "rb") as f:
        digest.update(f.read(_MIB))
        if size > 2 * _MIB:
            f.seek(size - _MIB)
        digest.update(f.read(_MIB))
    return f"{path.stem}-{digest.hexdigest()[:16]}"


def meta_dir(path: Path, cache_dir: Path | None) -> Path | None:
    """``cache_dir/gguf-meta/<gguf_cache_key>``: converted metadata of one GGUF file (config,
    tensor table), or ``None`` without a cache folder."""
    return Path(cache_dir) / "gguf-meta" / gguf_cache_key(Path(path)) if cache_dir else None


def transformers_version() -> str:
    """The installed transformers version, read from its package metadata: importing
    transformers itself costs seconds, and a cached load must not pay that."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "none"
