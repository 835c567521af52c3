"""Checkpoint loading: HF folders (config.json + safetensors) and GGUF files.

``load_model`` turns a resolved model path into a ready ``nn.Module`` on the target device,
building the architecture from the registry and streaming weights tensor by tensor.

Importing this package imports no torch: ``load_model_config`` on a cached GGUF reads one JSON
file, so ``ask``'s pre-load prompt check (``app/prompt_check.py``) refuses a prompt no
context holds without paying for the torch import. The weight loaders import torch when
called; their names (``iter_safetensors``, ``load_native_gguf``, ...) stay importable from
here, each module loaded on first access (``__getattr__``).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ModelConfig, QuantConfig
from ..errors import ModelLoadError

if TYPE_CHECKING:
    import torch
    from torch import nn

# names this package re-exported from its torch-bound modules, imported on first access
_LAZY = {
    "checked": ".checks",
    "gguf_tensor_names": ".gguf",
    "iter_gguf_tensors": ".gguf",
    "load_gguf_hf_config": ".gguf",
    "load_native_gguf": ".native",
    "load_quantized_model": ".quantized",
    "materialize": ".quantized",
    "iter_safetensors": ".safetensors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file: a ``.gguf`` name, or a regular file that starts with
    the GGUF magic ``b"GGUF"`` whatever its name (``model.bin``: ``hub.resolve`` takes a
    local file by its magic too). Never raises: an unreadable file is not one."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def load_hf_config(path: Path, cache_dir: Path | None = None):
    """The transformers config of an HF folder (never remote code) or a GGUF file.

    Raises ``ModelLoadError`` when it cannot be read.
    """
    path = Path(path)
    if is_gguf(path):
        from .gguf import load_gguf_hf_config

        return load_gguf_hf_config(path, cache_dir)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(f"cannot read model config in {path}: {exc}") from exc


def load_model_config(path: Path, cache_dir: Path | None = None) -> ModelConfig:
    """``ModelConfig`` for an HF folder or GGUF file. Raises ``ModelLoadError``.

    For a GGUF file with ``cache_dir``, the derived config is cached
    (``loader/config_cache.py``): a cached load reads one small JSON file and imports no
    transformers code; a missing, corrupt or stale entry is rebuilt through transformers.
    Within one process the result is memoized per (file, size, mtime, cache folder), so the
    pre-load prompt check and the load read it once.
    """
    path = Path(path)
    if not (is_gguf(path) and cache_dir is not None):
        return _model_config_from_hf(path, cache_dir)
    from ..cache_keys import meta_dir, transformers_version
    from .config_cache import read_cached_model_config, write_cached_model_config
    from .gguf_header import check_gguf_header

    check_gguf_header(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    memo_key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, str(cache_dir))
    if memo_key in _CONFIG_MEMO:
        return _CONFIG_MEMO[memo_key]
    meta = meta_dir(path, cache_dir)
    config = read_cached_model_config(meta)
    if config is None:
        config = _model_config_from_hf(path, cache_dir)
        write_cached_model_config(meta, config, f"transformers {transformers_version()}")
    _CONFIG_MEMO[memo_key] = config
    return config


_CONFIG_MEMO: dict[tuple, ModelConfig] = {}


def _model_config_from_hf(path: Path, cache_dir: Path | None) -> ModelConfig:
    """``ModelConfig`` derived from transformers' config of ``path`` (no engine cache)."""
    hf_config = load_hf_config(path, cache_dir)
    try:
        config = ModelConfig.from_hf_config(hf_config)
    except (AttributeError, ValueError) as exc:
        raise ModelLoadError(f"unusable model config in {path}: {exc}") from exc
    if is_gguf(path):
        # A GGUF without an output matrix ties the LM head to the embedding, whatever the
        # converted config says.
        from .gguf import gguf_tensor_names

        tied = "output.weight" not in gguf_tensor_names(path, cache_dir)
        config = dataclasses.replace(config, tie_word_embeddings=tied)
    return config


def load_model(
    path: Path,
    model_config: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int | None = None,
    cache_dir: Path | None = None,
    quant: QuantConfig | None = None,
    quant_kernel: str = "packed",
    progress: bool = False,
    a8_fp32: bool = False,
) -> nn.Module:
    """Build the model for ``model_config`` and load its weights from ``path``.

    Weights are converted to ``dtype`` tensor by tensor. ``max_position`` (tokens) sizes the
    RoPE table; ``cache_dir`` keeps a GGUF's parsed tensor table and the quantized-weight
    cache. ``quant`` picks the weight format (default: unquantized; "auto" loads unquantized
    here, since ``LLMEngine.from_path`` resolves "auto" with the memory planner before it calls
    this): a quantized scheme quantizes the decoder layers'
    projections layer by layer from the checkpoint's fp32 weights, or reads them from the
    cache (``engine/loader/quantized.py``); ``quant_kernel`` ("packed" or "dequant") picks the
    linear method's kernel (benchmarks and tests). ``native`` on a GGUF keeps each tensor in its
    own type, repacked exactly (``loader/native.py``; ``progress`` prints a progress line on
    a first load; ``a8_fp32`` as there); on a float checkpoint it means unquantized. The model's ``quant_scheme`` attribute
    records the format used. Raises ``UnsupportedArchitectureError``, ``ModelLoadError``
    (unreadable, truncated, or missing tensors: the message names up to three missing ones),
    or ``ValueError`` for a scheme the device does not offer.
    """
    import torch

    from ..models import get_model_class
    from ..quant.schemes import QuantScheme, resolve_scheme
    from .native import load_native_gguf
    from .quantized import load_quantized_model, materialize

    path = Path(path)
    scheme = resolve_scheme(quant.scheme if quant else "none", device)
    if scheme is QuantScheme.NATIVE and not is_gguf(path):
        scheme = QuantScheme.NONE  # a float checkpoint's own format is its float dtype
    model_cls = get_model_class(model_config)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = model_cls(model_config, max_position=max_position)
    finally:
        torch.set_default_dtype(old_dtype)
    model.quant_scheme = scheme
    if scheme is QuantScheme.NATIVE:
        return load_native_gguf(
            model, path, dtype=dtype, device=device, cache_dir=cache_dir,
            use_cache=quant.use_cache, kernel=quant_kernel,
            init_buffers=lambda m: _init_buffers(m, model_config, max_position),
            progress=progress, background_write=quant.background_write, a8_fp32=a8_fp32,
        )
    if scheme.is_quantized:
        quant = dataclasses.replace(quant, group_size=default_group_size(path, quant.group_size))
        def weights_fp32():
            return _iter_weights(path, model_config, torch.float32, cache_dir)

        return load_quantized_model(
            model, path, weights_fp32, scheme=scheme, quant=quant, dtype=dtype, device=device,
            cache_dir=cache_dir, kernel=quant_kernel,
            init_buffers=lambda m: _init_buffers(m, model_config, max_position),
        )
    materialize(model, device)  # like to_empty, without torch's Python meta kernels (sympy)
    _init_buffers(model, model_config, max_position)
    weights = _iter_weights(path, model_config, dtype, cache_dir)
    try:
        loaded = model.load_weights((name, t.to(device)) for name, t in weights)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    missing = model.expected_weights() - loaded
    if missing:
        shown = ", ".join(sorted(missing)[:3])
        raise ModelLoadError(f"{path}: checkpoint is missing {len(missing)} tensors ({shown})")
    for module in model.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return model.eval()


def default_group_size(path: Path, requested: int | None = None) -> int:
    """int4 group size for the checkpoint at ``path``: ``requested`` when given, else 32 for
    a GGUF file (llama.cpp stores weights in 32-weight blocks, Q4_K in 32-weight sub-blocks:
    a 4-bit source re-quantized on the same blocks is reproduced exactly, while groups of 128
    stack a second rounding on top of the first) and 128 for floating checkpoints."""
    if requested:
        return requested
    return 32 if is_gguf(path) else 128


def _iter_weights(path: Path, config: ModelConfig, dtype: torch.dtype, cache_dir: Path | None):
    """``(hf_name, tensor in dtype)`` pairs of a GGUF file or an HF folder, one at a time,
    each checked for NaN/Inf (``checks.check_finite``: ``ModelLoadError`` names the tensor)."""
    from .checks import checked

    if is_gguf(path):
        from .gguf import iter_gguf_tensors

        weights = iter_gguf_tensors(path, config.num_heads, config.num_kv_heads, dtype,
                                    cache_dir)
    else:
        from .safetensors import iter_safetensors

        weights = iter_safetensors(path, dtype)
    return checked(weights, path)


def _init_buffers(model: nn.Module, config: ModelConfig, max_position: int | None) -> None:
    """Recompute non-persistent buffers (the RoPE tables) lost by meta-device construction."""
    from ..layers.rotary import RotaryEmbedding

    table = None
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            if table is None:  # every layer shares one table
                fresh = RotaryEmbedding(
                    config.head_dim, max_position or config.max_position_embeddings,
                    config.rope_theta, config.rope_scaling,
                )
                table = fresh.cos_sin_cache.to(module.cos_sin_cache.device)
            module.cos_sin_cache = table
