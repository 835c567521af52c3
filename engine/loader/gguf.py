"""GGUF checkpoints: config from metadata (through transformers), tensors through ``gguf``.

Tensors are dequantized with the ``gguf`` package (its numpy reference dequantizers) and renamed
to HF names. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` for the ``llama``
architecture (interleaved -> half-split RoPE); ``_unpermute`` undoes it, as transformers'
``modeling_gguf_pytorch_utils`` does. References: the GGUF spec in ggml's ``docs/gguf.md``;
llama.cpp's ``convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..cache_keys import gguf_cache_key, meta_dir, transformers_version  # noqa: F401 (re-exported)
from ..errors import ModelLoadError
from .gguf_header import check_gguf_header

logger = logging.getLogger(__name__)

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
            f"cannot read GGUF file {path}: truncated, or its header or metadata is corrupt "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _meta_dir(path: Path, cache_dir: Path | None) -> Path | None:
    """``cache_dir/gguf-meta/<gguf_cache_key>``: converted metadata of one GGUF file."""
    return meta_dir(path, cache_dir)


def _write_atomically(target: Path, name: str, text: str) -> None:
    """Write the cache file ``target/name`` via a temp file and a rename. The cache is
    optional: a failed write (full disk, read-only folder) is logged and never fails a load."""
    tmp = None
    try:
        target.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target / name)
    except OSError as exc:
        logger.warning("could not write the metadata cache %s: %s", target / name, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def load_gguf_hf_config(path: Path, cache_dir: Path | None = None):
    """The transformers ``PretrainedConfig`` of a GGUF file: for the engine's architectures
    built from a one-pass header read with transformers' key tables (``gguf_config.py``),
    otherwise ``AutoConfig`` with ``gguf_file`` (which parses the whole file again).

    With ``cache_dir`` the result is saved as
    ``cache_dir/gguf-meta/<gguf_cache_key>/config.json`` and read from there later.

    Raises ``ModelLoadError`` when the file is not a readable GGUF.
    """
    from transformers import AutoConfig

    path = Path(path)
    check_gguf_header(path)
    meta = _meta_dir(path, cache_dir)
    if meta is not None and (meta / "config.json").is_file():
        return AutoConfig.from_pretrained(str(meta))
    from .gguf_config import hf_config_from_header
    from .gguf_header import read_gguf_header

    header = read_gguf_header(path)  # ModelLoadError for a truncated or corrupt header
    try:
        config = hf_config_from_header(header) or AutoConfig.from_pretrained(
            str(path.parent), gguf_file=path.name)
    except Exception as exc:
        # transformers reports a metadata it cannot parse as "config file ... is not a valid
        # JSON file"; our reader names the real problem (ModelLoadError) when the file is bad.
        open_gguf(path)
        detail = f"{type(exc).__name__}: {exc}"
        if "not a valid JSON file" in detail:
            detail = "transformers cannot parse its metadata"
        raise ModelLoadError(
            f"cannot read GGUF file {path}: its metadata is corrupt or unsupported ({detail})"
        ) from exc
    if meta is not None:
        _write_atomically(meta, "config.json", config.to_json_string())
    return config


def _tensor_index(path: Path, cache_dir: Path | None) -> dict:
    """Architecture and tensor table (name, GGML type, GGUF dims, byte offset and size, the
    raw numpy dtype/shape) of a GGUF file.

    Read with the one-pass header reader (``gguf_header.py``: 0.1-0.3 s where
    ``gguf.GGUFReader`` took 11-14 s on a 151k-token vocabulary); with ``cache_dir`` the table
    is also kept as ``tensors.json`` beside the cached config; the key hashes the file's ends
    and size, so a changed file is re-parsed. Raises ``ModelLoadError`` for a bad file.
    """
    from .gguf_header import numpy_view_spec, read_gguf_header

    meta = _meta_dir(path, cache_dir)
    if meta is not None and (meta / "tensors.json").is_file():
        return json.loads((meta / "tensors.json").read_text())
    check_gguf_header(path)
    header = read_gguf_header(path)
    tensors = []
    for t in header.tensors:
        np_dtype, np_shape = numpy_view_spec(t)
        tensors.append({"name": t.name, "type": t.ggml_type, "dims": list(t.dims),
                        "offset": t.offset, "n_bytes": t.n_bytes, "np_dtype": np_dtype,
                        "np_shape": np_shape})
    index = {"architecture": header.architecture, "tensors": tensors}
    if meta is not None:
        _write_atomically(meta, "tensors.json", json.dumps(index))
    return index


def gguf_tensor_names(path: Path, cache_dir: Path | None = None) -> set[str]:
    """GGUF names of the tensors in ``path`` (e.g. to see whether ``output.weight`` exists)."""
    return {t["name"] for t in _tensor_index(Path(path), cache_dir)["tensors"]}


def iter_gguf_tensors(
    path: Path, num_heads: int, num_kv_heads: int, dtype: torch.dtype,
    cache_dir: Path | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every GGUF tensor we load, dequantized to ``dtype``.

    Shapes are HF's (``[out_features, in_features]``; GGUF stores dims reversed). The file is
    memory-mapped; ``gguf.quants.dequantize`` turns each tensor's blocks into fp32.
    Raises ``ModelLoadError`` for an unreadable file or an unsupported quantization type.
    """
    import gguf

    path = Path(path)
    check_gguf_header(path)
    index = _tensor_index(path, cache_dir)
    permute = index["architecture"] == "llama"
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for t in index["tensors"]:
        name = hf_name(t["name"])
        if name is None:
            continue
        qtype = gguf.GGMLQuantizationType(t["type"])
        end = t["offset"] + t["n_bytes"]
        if end > data.shape[0]:
            raise ModelLoadError(f"cannot read GGUF file {path}: truncated at tensor {t['name']}")
        raw = np.asarray(data[t["offset"] : end]).view(np.dtype(t["np_dtype"]))
        try:
            arr = gguf.quants.dequantize(raw.reshape(t["np_shape"]), qtype)
        except NotImplementedError as exc:
            raise ModelLoadError(
                f"{path}: tensor {t['name']} uses unsupported GGUF type {qtype.name}"
            ) from exc
        except Exception as exc:
            raise ModelLoadError(
                f"cannot read GGUF file {path}: tensor {t['name']} is corrupt ({exc})"
            ) from exc
        shape = tuple(reversed(t["dims"]))
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if permute and ".q_proj." in name:
            arr = _unpermute(arr, num_heads)
        elif permute and ".k_proj." in name:
            arr = _unpermute(arr, num_kv_heads)
        if not (arr.flags.writeable and arr.flags.c_contiguous):
            arr = np.array(arr, copy=True, order="C")  # unquantized tensors view the mmap
        yield name, torch.from_numpy(arr).to(dtype)
