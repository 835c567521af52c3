"""Load a GGUF in its own quantization (``--quant native``): repack tensor by tensor.

The model is built on the meta device; every layer's method is chosen from the GGUF tensor
table before any tensor is read (``engine/quant/native.py``), its stored layout allocated
empty, and each tensor's blocks are repacked straight from the memory-mapped file into it
(``engine/quant/gguf_repack.py``): no float copy of a quantized tensor exists at any point.
The result is saved to the quantized-weight cache (``engine/quant/cache.py``) and read from it
on later loads. Reference design: llama.cpp's loader (mmap, per-tensor types) and vLLM's
``GGUFLinearMethod``.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import ModelLoadError
from ..layers import greedy_head
from ..layers.linear import Linear
from ..quant.cache import (
    NATIVE_FORMAT,
    cache_path,
    entry_ready,
    load_quantized_mmap,
    save_quantized,
)
from ..quant.gguf_repack import (
    dequantize_repacked,
    ggml_layout,
    repack_gguf_tensor,
    repacked_group,
    scale_dtype,
    unpermute_rows,
    unpermute_source_rows,
)
from ..quant.int4_panel import adopt_panel, panel_scheme
from ..quant.methods import LinearMethod
from ..quant.native import (
    NativeInt4LinearMethod,
    copy_repacked_rows,
    native_method,
    repack_into_rows,
)
from .gguf import _tensor_index, check_gguf_header, hf_name
from .quantized import materialize

logger = logging.getLogger(__name__)


def _layout_of(t: dict) -> tuple[str, int, bool, torch.dtype | None]:
    """``(layout, group_size, has_mins, scale_dtype)`` a tensor-table entry repacks onto;
    Q6_K is ``("int6", 16, False, int8)``, which ``native_method`` holds as int6 where the CPU
    kernels read it and as group-wise int8 (``INT6_AS_INT8``) elsewhere; Q5_0 with rows of a
    multiple of 128 columns is ``("int5", 32, False, fp16)`` (int5 or ``INT5_AS_INT8``)."""
    layout = ggml_layout(t["type"], t["name"])
    if layout == "float":
        return (layout, 0, False, None)
    if t["type"] == 14:  # Q6_K
        return ("int6", 16, False, torch.int8)
    if t["type"] == 6 and len(t["dims"]) == 2 and t["dims"][0] % 128 == 0:  # Q5_0, K = dims[0]
        return ("int5", 32, False, torch.float16)
    group, has_mins = repacked_group(t["type"])
    return (layout, group, has_mins, scale_dtype(t["type"]))


def _shard_order(shard: str | int | None) -> int:
    """Position of shard ``shard`` in its fused layer's output (``q, k, v``; ``0, 1``)."""
    return {"q": 0, "k": 1, "v": 2}[shard] if isinstance(shard, str) else int(shard or 0)


def native_layouts(path: Path, model: nn.Module, cache_dir: Path | None = None
                   ) -> dict[str, list[tuple[str | int | None, tuple]]]:
    """``module name -> [(shard id, (layout, group_size, has_mins, scale_dtype))]``, in the
    layer's output order, for every ``Linear`` (and the embedding) that a GGUF tensor of
    ``path`` fills, from the tensor table alone (shard id ``None`` for unfused layers).

    Raises ``ModelLoadError`` naming the tensor and type for an unsupported GGUF type.
    """
    index = _tensor_index(Path(path), cache_dir)
    modules = dict(model.named_modules())
    out: dict[str, list] = {}
    for t in index["tensors"]:
        name = hf_name(t["name"])
        if name is None or not name.endswith(".weight"):
            continue
        module, _, shard = model.weight_target(name)
        if not isinstance(modules.get(module), Linear):
            continue
        out.setdefault(module, []).append((shard, _layout_of(t)))
    for items in out.values():
        items.sort(key=lambda item: _shard_order(item[0]))
    return out


def load_native_gguf(model: nn.Module, path: Path, *, dtype: torch.dtype,
                     device: torch.device, cache_dir: Path | None, use_cache: bool,
                     init_buffers, kernel: str = "packed", progress: bool = False,
                     background_write: bool = False, a8_fp32: bool = False) -> nn.Module:
    """Fill meta-constructed ``model`` with the GGUF's own weights (see the module doc).

    Float tensors (norms, biases, F32/F16 weights) are converted to ``dtype``. With
    ``cache_dir`` and ``use_cache`` the repacked state is cached and read back on later loads
    (``model.quant_cache_hit``). ``progress`` prints a one-line progress counter on stderr
    during a first (uncached) load; ``background_write`` writes that load's cache entry from a
    thread (``save_quantized``). ``a8_fp32``: fp32 activations that take the integer-dot
    kernels (``LLMEngine.a8_fp32``), so panel layouts apply as for 16-bit ones
    (``int4_panel.panel_kinds``). Returns the model after ``process_weights_after_loading``.

    Raises ``ModelLoadError`` for a truncated/corrupt file, an unsupported tensor type, a shape
    mismatch, or missing tensors (naming up to three).
    """
    path = Path(path)
    check_gguf_header(path)
    layouts = native_layouts(path, model, cache_dir)
    modules = dict(model.named_modules())
    quantized: dict[str, Linear] = {}
    for name, items in layouts.items():
        layer = modules[name]
        rows = [(sid, end - start) for sid, _ in items
                for start, end in [layer.shard_range(sid)]]
        method = native_method([lay for _, lay in items], device, kernel,
                               keep_rows=name == "model.embed_tokens", shards=rows)
        layer.quant_method = method
        if type(method) is not LinearMethod:
            try:
                method.create_weights(layer, device)
            except ValueError as exc:  # a sharded layer whose file lacks one of its shards
                raise ModelLoadError(f"{path}: {name}: {exc}") from exc
            quantized[name] = layer
    materialize(model, device)
    init_buffers(model)
    head = _output_layer(model, quantized)
    if head is not None:  # the output layer's error bound, cached with the weights
        greedy_head.add_bound_buffer(head, device)
    # native Q4_K / Q4_0 / Q4_1 / Q5_0 / Q6_K / Q8_0 layers in the panel layouts whose kernels
    # run here (int4_panel.py, int5_panel.py, int6_panel.py, int8_panel.py), cached as such
    panel = adopt_panel(model, device, dtype, head, a8_fp32)
    cached = None
    if cache_dir is not None and use_cache:
        scheme = panel_scheme(panel) + _q5_suffix(layouts, device, kernel)
        cached = cache_path(cache_dir, path, scheme, 32, dtype, NATIVE_FORMAT)
    model.quant_cache_hit = False
    model.quant_cache_entry = None
    # int4 layers (or shards of a sharded layer, ``shard_<id>`` modules) that PyTorch's CPU
    # kernel repacks are copied (then repacked one at a time); everything else, int4 layers
    # that localchat's C++ kernels read in place included, is a view of the mapped cache file
    modules = dict(model.named_modules())
    repacked = {n for n, m in modules.items()
                if isinstance(getattr(m, "quant_method", None), NativeInt4LinearMethod)
                and m.quant_method.replaces_weights_on_load()}
    finished: set[str] = set()

    def finish(name):
        if name in repacked:
            modules[name].process_weights_after_loading()
            finished.add(name)

    if cached is not None and entry_ready(cached):
        for layer in panel:  # empty panel tensors, for the entry's to be mapped over
            layer.quant_method.to_panel(layer, convert=False)
        model.quant_cache_hit = load_quantized_mmap(
            model, cached, copy_modules=repacked, on_module_loaded=finish, fmt=NATIVE_FORMAT)
        if model.quant_cache_hit:
            model.quant_cache_entry = cached
        else:
            for layer in panel:
                layer.quant_method.to_rows(layer, device)
    if not model.quant_cache_hit:
        _repack_all(model, path, quantized, dtype, device, cache_dir, progress)
        if head is not None:  # from the row layout's C++ dequantizer, before any panel
            greedy_head.fill_bound(head)
        for layer in panel:
            layer.quant_method.to_panel(layer)
        if cached is not None:
            try:
                save_quantized(model, cached, {"scheme": "native", "model": path.name,
                                               "format": NATIVE_FORMAT},
                               background=background_write)
            except OSError as exc:  # a full or read-only cache must not fail the load
                logger.warning("could not write quantized cache %s: %s", cached, exc)
    for name, module in model.named_modules():
        if name not in finished and hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    model.native_weight_bytes = native_weight_bytes(path, model.config, device, dtype,
                                                    cache_dir, kernel)
    return model.eval()


def _q5_suffix(layouts: dict, device: torch.device, kernel: str) -> str:
    """``"-q5i8"`` where the file's Q5_0 tensors are held as int8 (``native.INT5_AS_INT8``:
    ``LOCALCHAT_CPU_INT5=0``, or no int5 kernels here), else ``""``: so the int8 and int5
    forms of a model's Q5_0 layers are two cache entries, not one rebuilt at each switch."""
    from ..quant.native_int5 import int5_usable

    has_q5 = any(lay[0] == "int5" for items in layouts.values() for _, lay in items)
    return "-q5i8" if has_q5 and not (kernel == "packed" and int5_usable(device)) else ""


def _output_layer(model: nn.Module, quantized: dict[str, Linear]) -> Linear | None:
    """The quantized output layer (``lm_head``, or the tied embedding), or None when it is
    float."""
    name = "model.embed_tokens" if getattr(model, "lm_head", None) is None else "lm_head"
    return quantized.get(name)


def _release_pages(data: np.memmap, offset: int, n_bytes: int) -> None:
    """Drop a repacked tensor's file pages from this process (``MADV_DONTNEED`` on the
    read-only map; they stay in the page cache): the first load held the whole GGUF resident
    beside its repacked copy, 2.37 GiB at peak for Qwen2.5-Coder-1.5B against 1.30 GiB for a
    cached load (a trial's ``/usr/bin/time``). A no-op where the platform has no madvise."""
    mm = getattr(data, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(offset + n_bytes, len(mm))
    with contextlib.suppress(OSError, ValueError):
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def _repack_all(model, path: Path, quantized: dict[str, Linear], dtype, device, cache_dir,
                progress: bool) -> None:
    index = _tensor_index(path, cache_dir)
    config = model.config
    permute = index["architecture"] == "llama"
    data = np.memmap(path, dtype=np.uint8, mode="r")
    expected = model.expected_weights()
    pending = {(name, s) for name, layer in quantized.items() for s in _shards(layer)}
    loaded: set[str] = set()
    tensors = [t for t in index["tensors"] if hf_name(t["name"]) is not None]
    start = time.perf_counter()
    for i, t in enumerate(tensors):
        name = hf_name(t["name"])
        end = t["offset"] + t["n_bytes"]
        if end > data.shape[0]:
            raise ModelLoadError(f"cannot read GGUF file {path}: truncated at tensor {t['name']}")
        shape = tuple(reversed(t["dims"]))
        raw = data[t["offset"]:end]
        heads = (config.num_heads if ".q_proj." in name else
                 config.num_kv_heads if ".k_proj." in name else None) if permute else None
        module, pname, shard = model.weight_target(name)
        try:
            if module in quantized and pname == "weight":
                layer = quantized[module]
                rows = layer.shard_range(shard) if shard is not None else (0, layer.out_features)
                # the C++ op writes the layer's rows directly (the Q/K unpermute as its row
                # order); otherwise repack, unpermute and copy
                source_rows = None if heads is None or len(shape) != 2 \
                    else unpermute_source_rows(shape[0], heads)
                if not repack_into_rows(layer, raw, t["type"], shape, *rows, source_rows,
                                        t["name"]):
                    w = _repacked(raw, t, shape, heads)
                    copy_repacked_rows(layer, w, *rows)
                pending.discard((module, shard))
            else:
                tensor = dequantize_repacked(_repacked(raw, t, shape, heads)).to(dtype)
                loaded |= model.load_weights([(name, tensor.to(device))])
        except ValueError as exc:
            raise ModelLoadError(f"{path}: {t['name']}: {exc}") from exc
        _release_pages(data, t["offset"], t["n_bytes"])
        if progress:
            print(f"\rrepacking {path.name}: {i + 1}/{len(tensors)} tensors "
                  f"({time.perf_counter() - start:.1f} s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    missing = sorted(expected - loaded) + sorted(f"{m}:{s}" for m, s in pending)
    if missing:
        shown = ", ".join(missing[:3])
        raise ModelLoadError(f"{path}: checkpoint is missing {len(missing)} tensors ({shown})")


def _repacked(raw, t: dict, shape: tuple, heads: int | None):
    """Tensor-table entry ``t``'s bytes ``raw`` repacked, Q/K rows unpermuted over ``heads``
    (llama.cpp's permutation; None: none)."""
    w = repack_gguf_tensor(raw, t["type"], shape, t["name"])
    return w if heads is None else unpermute_rows(w, heads)


def _shards(layer: Linear) -> list:
    """Shard ids of a (possibly fused) layer: ``q/k/v``, ``0/1`` or ``None``."""
    if hasattr(layer, "q_size"):
        return ["q", "k", "v"]
    if hasattr(layer, "offsets"):
        return list(range(len(layer.offsets) - 1))
    return [None]


def native_weight_bytes(path: Path, model_config, device: torch.device | str = "cpu",
                        dtype: torch.dtype | None = None, cache_dir: Path | None = None,
                        kernel: str = "packed") -> int:
    """Exact bytes the ``native`` weights of GGUF ``path`` occupy once loaded on ``device``
    (what :func:`load_native_gguf` holds after ``process_weights_after_loading``; the RoPE
    table and the KV cache not included), from the tensor table alone: no tensor is read.

    Float tensors count in ``dtype`` (default: the device's unquantized format). Raises
    ``ModelLoadError`` for an unreadable file or an unsupported tensor type.
    """
    from ..models import get_model_class
    from ..quant.schemes import default_float_dtype

    device = torch.device(device)
    dtype = dtype or default_float_dtype(device)
    cls = get_model_class(model_config)
    index = _tensor_index(Path(path), cache_dir)
    shards: dict[str, list] = {}  # module -> [(shard id, layout, shape)]
    total = 0
    for t in index["tensors"]:
        name = hf_name(t["name"])
        if name is None:
            continue
        if name == "lm_head.weight" and model_config.tie_word_embeddings:
            continue
        shape = tuple(reversed(t["dims"]))
        module, pname, shard = cls.weight_target(name)
        is_linear = pname == "weight" and len(shape) == 2 and (
            module.endswith("_proj") or module in ("lm_head", "model.embed_tokens"))
        if not is_linear:
            total += int(np.prod(shape)) * dtype.itemsize
            continue
        shards.setdefault(module, []).append((shard, _layout_of(t), shape))
    for module, items in shards.items():
        items.sort(key=lambda item: _shard_order(item[0]))
        n = sum(shape[0] for _, _, shape in items)
        k = items[0][2][1]
        method = native_method([lay for _, lay, _ in items], device, kernel,
                               keep_rows=module == "model.embed_tokens",
                               shards=[(sid, shape[0]) for sid, _, shape in items])
        total += method.weight_bytes(n, k, dtype)
        head = "model.embed_tokens" if model_config.tie_word_embeddings else "lm_head"
        if module == head and type(method) is not LinearMethod:
            total += greedy_head.bound_bytes(k)  # its error bound (add_bound_buffer)
    return total


def gguf_native_bytes(path, model_config, device, dtype, cache_dir=None) -> int | None:
    """:func:`native_weight_bytes` for a ``.gguf`` path; ``None`` for a float checkpoint or
    a GGUF with a tensor type the native format cannot hold (the planner then chooses
    among the other formats)."""
    from . import is_gguf

    if path is None or not is_gguf(Path(path)):
        return None
    try:
        return native_weight_bytes(Path(path), model_config, device, dtype, cache_dir)
    except ModelLoadError:
        return None


def native_is_fast(path, device, cache_dir=None) -> bool:
    """Whether ``--quant auto`` may offer GGUF ``path``'s own format on ``device`` (the one
    place it is decided): on CUDA always (Triton int4/int8); float-only files always. On CPU
    only where localchat's C++ kernels serve every quantized layer: 4-bit layers through its
    own int4 kernels over the file's scales (``engine/quant/cpu_int4.py``; PyTorch's int4pack
    kernel, what runs without them, rounds scales and mins to bf16, which turned SmolLM2's
    greedy answer to "What is the capital of France?" from Paris into a French list), and
    group-wise int8 layers (Q8_0, Q5_x, ...; Q6_K / Q5_0 as int6 / int5) through the C++
    kernels (decode) and the C++ dequantize + bf16 GEMM (prefill; the PyTorch fallback's fp32
    row blocks prefilled at 0.03-0.3x the bf16 format's speed). Without a compiler the
    planner's float choice stays."""
    if torch.device(device).type == "cuda":
        return True
    index = _tensor_index(Path(path), cache_dir)
    try:
        kinds = {_layout_of(t)[0] for t in index["tensors"] if hf_name(t["name"]) is not None}
    except ModelLoadError:
        return False
    if "int4" in kinds:
        from ..quant.cpu_int4 import own_kernels

        if not own_kernels():
            return False
    if kinds & {"int8", "int6", "int5"}:  # int6 / int5 fall back to int8 without the kernels
        from ..quant.native import _cpu_kernel_rows

        return _cpu_kernel_rows() > 0
    return True
