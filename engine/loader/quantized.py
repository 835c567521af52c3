"""Quantize at load time, layer by layer, through the quantized-weight cache.

The decoder layers' projections get the scheme's linear method; their float weights are
allocated (fp32, on the target device) only when the checkpoint reaches their layer
(``model.layers.N.``), quantized as soon as every shard of a projection is in, and freed, so peak
memory stays near the final size plus the layers in flight (one, for checkpoints stored in
layer order, which GGUF and HF safetensors are). The result is saved to
``engine/quant/cache.py``'s cache; a later load with the same key reads it instead and does not
touch the checkpoint's weights. Reference design: vLLM's ``QuantizeMethodBase`` life cycle
(create weights, load, ``process_weights_after_loading``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ..config import QuantConfig
from ..errors import ModelLoadError
from ..layers.linear import Linear
from ..quant.cache import cache_path, entry_ready, load_quantized, save_quantized
from ..quant.methods import make_linear_method
from ..quant.schemes import QuantScheme

logger = logging.getLogger(__name__)

_LAYER_RE = re.compile(r"^(model\.layers\.\d+)\.")


def assign_linear_methods(
    model: nn.Module, scheme: QuantScheme, device: torch.device, group_size: int = 128,
    kernel: str = "packed",
) -> dict[str, Linear]:
    """Give every ``Linear`` under ``model.layers`` the linear method of ``scheme`` (the LM
    head keeps the float method). Returns the layers that are actually quantized, by name."""
    quantized: dict[str, Linear] = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear) and name.startswith("model.layers."):
            module.quant_method = make_linear_method(
                scheme, device, module.in_features, group_size, kernel
            )
            if module.quant_method.scheme.is_quantized:
                quantized[name] = module
    return quantized


def materialize(model: nn.Module, device: torch.device, skip: Iterable[nn.Module] = ()) -> None:
    """Allocate (uninitialized) every meta parameter and buffer on ``device``, except the
    ``weight`` of the modules in ``skip`` (staged later, layer by layer)."""
    skip_ids = {id(m) for m in skip}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is None or not p.is_meta or (name == "weight" and id(module) in skip_ids):
                continue
            # torch.empty, not empty_like: empty_like of a meta tensor runs the Python
            # reference kernels, which import sympy and torch.fx (about 1 s).
            module._parameters[name] = nn.Parameter(
                torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=False
            )
        for name, b in module._buffers.items():
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)


def load_quantized_model(
    model: nn.Module, path: Path, weights_fn, *, scheme: QuantScheme, quant: QuantConfig,
    dtype: torch.dtype, device: torch.device, cache_dir: Path | None, init_buffers,
    kernel: str = "packed",
) -> nn.Module:
    """Fill meta-constructed ``model`` with ``scheme`` weights: from the cache when present,
    else from ``weights_fn()`` (an iterator of fp32 ``(hf_name, tensor)``), quantizing layer
    by layer and then writing the cache. ``init_buffers(model)`` recomputes non-persistent
    buffers. Returns the model after ``process_weights_after_loading``.

    Raises ``ModelLoadError`` for a shape mismatch or missing tensors (naming up to three).
    """
    quantized = assign_linear_methods(model, scheme, device, quant.group_size, kernel)
    cached = None
    if cache_dir is not None and quant.use_cache:
        cached = cache_path(cache_dir, path, scheme.value, quant.group_size, dtype)
    model.quant_cache_hit = False
    if cached is not None and entry_ready(cached):
        for layer in quantized.values():
            layer.quant_method.create_weights(layer, device)
        materialize(model, device)
        init_buffers(model)
        if load_quantized(model, cached):
            model.quant_cache_hit = True
            return _finish(model)
        for layer in quantized.values():  # mismatched cache: start over from the checkpoint
            for name in ("qweight", "scales", "mins"):
                layer._buffers.pop(name, None)
            layer.weight = nn.Parameter(
                torch.empty(layer.out_features, layer.in_features, device="meta"),
                requires_grad=False,
            )
    materialize(model, device, skip=quantized.values())
    init_buffers(model)
    _load_and_quantize(model, path, weights_fn(), quantized, device)
    if cached is not None:
        try:
            save_quantized(model, cached, {"scheme": scheme.value, "model": Path(path).name},
                           background=quant.background_write)
        except OSError as exc:  # a full or read-only cache must not fail the load
            logger.warning("could not write quantized cache %s: %s", cached, exc)
    return _finish(model)


def _finish(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return model.eval()


def _layer_batches(weights):
    """Group consecutive ``(hf_name, tensor)`` pairs by decoder layer (``model.layers.N``;
    ``None`` for tensors outside the layers): one ``load_weights`` call per batch."""
    batch, key = [], None
    for hf_name, tensor in weights:
        m = _LAYER_RE.match(hf_name)
        k = m.group(1) if m else None
        if batch and k != key:
            yield key, batch
            batch = []
        key = k
        batch.append((hf_name, tensor))
    if batch:
        yield key, batch


def _load_and_quantize(model, path, weights, quantized: dict[str, Linear], device) -> None:
    expected = model.expected_weights()
    pending = {name: {k for k in expected if k.split(":")[0] == f"{name}.weight"}
               for name in quantized}
    by_layer: dict[str, list[str]] = {}
    for name in quantized:
        by_layer.setdefault(_LAYER_RE.match(name).group(1), []).append(name)
    loaded: set[str] = set()
    for layer_key, batch in _layer_batches(weights):
        for name in by_layer.pop(layer_key, []):  # stage this layer's float weights
            layer = quantized[name]
            layer.weight = nn.Parameter(
                torch.empty(layer.out_features, layer.in_features, dtype=torch.float32,
                            device=device),
                requires_grad=False,
            )
        try:
            keys = model.load_weights((n, t.to(device)) for n, t in batch)
        except ValueError as exc:
            raise ModelLoadError(f"{path}: {exc}") from exc
        del batch
        loaded |= keys
        for key in keys:
            name = key.split(":")[0].removesuffix(".weight")
            if name in pending and key in pending[name]:
                pending[name].discard(key)
                if not pending[name]:  # every shard is in: quantize and free the float copy
                    layer = quantized[name]
                    if layer.weight.is_meta:
                        raise ModelLoadError(f"{path}: {name} arrived outside its layer")
                    layer.quant_method.quantize_weights(layer)
                    del pending[name]
    missing = expected - loaded
    if missing:
        shown = ", ".join(sorted(missing)[:3])
        raise ModelLoadError(f"{path}: checkpoint is missing {len(missing)} tensors ({shown})")
