"""The cached ``ModelConfig`` of a GGUF file: a cached load never imports transformers' config code.

The first load converts the GGUF metadata with transformers (``AutoConfig`` with ``gguf_file``,
seconds: it imports transformers and walks every metadata field) and derives the engine's
``ModelConfig`` from it. That derived config is saved as
``cache_dir/gguf-meta/<gguf_cache_key>/model_config.json``; later loads read only this file.

The entry is trusted only when it is whole and current: it carries ``CONFIG_CACHE_VERSION``
(bumped whenever ``ModelConfig`` or its derivation changes), and the folder key already hashes
the file (name, size, first and last MiB) and the transformers version that converted it. A
missing, corrupt or stale entry reads as ``None`` (a corrupt or stale one is deleted) and the
caller rebuilds it from transformers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from ..config import ModelConfig

logger = logging.getLogger(__name__)

CONFIG_CACHE_VERSION = 1
CONFIG_CACHE_FILE = "model_config.json"


def read_cached_model_config(meta_dir: Path) -> ModelConfig | None:
    """The ``ModelConfig`` cached in ``meta_dir``, or ``None`` when there is none, or it is
    corrupt (unparsable JSON, missing or wrongly typed fields) or from another
    ``CONFIG_CACHE_VERSION`` (then the file is removed so that it is rebuilt)."""
    file = Path(meta_dir) / CONFIG_CACHE_FILE
    try:
        text = file.read_text()
    except OSError:
        return None
    try:
        entry = json.loads(text)
        if entry.get("version") != CONFIG_CACHE_VERSION:
            raise ValueError(f"version {entry.get('version')!r}, want {CONFIG_CACHE_VERSION}")
        fields = entry["config"]
        names = {f.name for f in dataclasses.fields(ModelConfig)}
        if not isinstance(fields, dict) or set(fields) != names:
            raise ValueError("fields differ from ModelConfig's")
        config = ModelConfig(**fields)
        _check_types(config)
        return config
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.info("rebuilding the config cache %s: %s", file, exc)
        file.unlink(missing_ok=True)
        return None


def write_cached_model_config(meta_dir: Path, config: ModelConfig, source: str) -> None:
    """Save ``config`` (derived from ``source``, e.g. ``"transformers 5.2.0"``) into
    ``meta_dir`` atomically. A failed write is logged and never fails a load."""
    from .gguf import _write_atomically

    entry = {"version": CONFIG_CACHE_VERSION, "source": source,
             "config": dataclasses.asdict(config)}
    _write_atomically(Path(meta_dir), CONFIG_CACHE_FILE, json.dumps(entry, indent=1))


_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim",
               "max_position_embeddings")


def _check_types(config: ModelConfig) -> None:
    """Raise ``TypeError`` (or ``ValueError``) for a field of the wrong type or range (a
    hand-edited or damaged entry)."""
    for name in _INT_FIELDS:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise TypeError(f"{name} = {value!r} is not a positive integer")
    for name in ("rms_norm_eps", "rope_theta"):
        if not isinstance(getattr(config, name), (int, float)):
            raise TypeError(f"{name} is not a number")
    if not isinstance(config.architecture, str) or not config.architecture:
        raise TypeError("architecture is not a name")
    if config.rope_scaling is not None and not isinstance(config.rope_scaling, dict):
        raise TypeError("rope_scaling is not a mapping")
