"""GGUF checkpoints: config from metadata (through transformers), tensors through ``gguf``.

Tensors are dequantized with the ``gguf`` package (its numpy reference dequantizers) and renamed
to HF names. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` for the ``llama``
architecture (interleaved -> half-split RoPE); ``_unpermute`` undoes it, as transformers'
``modeling_gguf_pytorch_utils`` does. References: the GGUF spec in ggml's ``docs/gguf.md``;
llama.cpp's ``convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError

_GGUF_MAGIC = b"GGUF"

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str | None:
    """HF parameter name for a GGUF tensor name, or ``None`` for tensors we do not load
    (e.g. ``rope_freqs.weight``, which the config's RoPE scaling reproduces)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's Q/K row permutation for ``n_head`` heads; ``w [rows, ...]``."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def check_gguf_header(path: Path) -> None:
    """Raise ``ModelLoadError`` unless ``path`` starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic {magic!r})")


def open_gguf(path: Path):
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped).

    Raises ``ModelLoadError`` for a missing, non-GGUF, truncated or corrupt file.
    """
    import gguf

    check_gguf_header(path)
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on bad data
        raise ModelLoadError(
            f"cannot read GGUF file {path}: truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from exc


def _cache_key(path: Path) -> str:
    st = path.stat()
    return f"{path.stem}-{st.st_size}-{int(st.st_mtime)}"


def load_gguf_hf_config(path: Path, cache_dir: Path | None = None):
    """The transformers ``PretrainedConfig`` of a GGUF file (``AutoConfig`` with ``gguf_file``).

    The conversion parses the whole file (seconds), so with ``cache_dir`` the result is saved
    as ``cache_dir/gguf-configs/<name>-<size>-<mtime>/config.json`` and read from there later.

    Raises ``ModelLoadError`` when the file is not a readable GGUF.
    """
    from transformers import AutoConfig

    path = Path(path)
    check_gguf_header(path)
    cached = Path(cache_dir) / "gguf-configs" / _cache_key(path) if cache_dir else None
    if cached is not None and (cached / "config.json").is_file():
        return AutoConfig.from_pretrained(str(cached))
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read GGUF file {path}: truncated, corrupt or unsupported "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent))
        config.save_pretrained(str(tmp))
        try:
            os.replace(tmp, cached)
        except OSError:  # another process won the race; theirs is identical
            pass
    return config


def iter_gguf_tensors(
    path: Path, num_heads: int, num_kv_heads: int, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every GGUF tensor we load, dequantized to ``dtype``.

    Shapes are HF's (``[out_features, in_features]``; GGUF stores dims reversed).
    Raises ``ModelLoadError`` for an unreadable file or an unsupported quantization type.
    """
    import gguf

    reader = open_gguf(Path(path))
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
    permute = arch == "llama"
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise ModelLoadError(
                f"{path}: tensor {t.name} uses unsupported GGUF type {t.tensor_type.name}"
            ) from exc
        except Exception as exc:
            raise ModelLoadError(
                f"cannot read GGUF file {path}: tensor {t.name} is truncated or corrupt ({exc})"
            ) from exc
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if permute and ".q_proj." in name:
            arr = _unpermute(arr, num_heads)
        elif permute and ".k_proj." in name:
            arr = _unpermute(arr, num_kv_heads)
        yield name, torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)

