"""On-disk cache of quantized weights (safetensors), so a second load skips quantization.

One file per (model, model-file hash or revision, scheme, group size, float dtype):
``<cache_dir>/quant/<model key>-<scheme>-g<group>-<dtype>.safetensors``. It holds the whole
state dict of the loaded model in the portable layout (``qweight``/``scales``/``mins`` as in
``int8.py``/``int4.py``/``fp8.py``, float tensors in the model dtype), before any device repack,
so it serves every device. The model key of a GGUF file is ``gguf_cache_key`` (name, size, first
and last MiB, transformers version); of an HF folder, a hash of ``config.json`` and each
safetensors file's name, size and header (the folder name is the revision in the HF cache).
Writes are atomic (temporary file + ``os.replace``); an unreadable or mismatched file is treated
as a miss and rewritten. A load or write marks the file used (``cache_gc.mark_used``), which also
removes the files it supersedes once they are a day unused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn

from ..cache_gc import mark_used

logger = logging.getLogger(__name__)

# 2: int4 stores mins (q * scale + min) instead of zeros; the native GGUF format
FORMAT = "localchat-quant-2"
# the native format's own version (its layouts change apart from int4/int8's): 3 stores fp16
# scales/mins for the GGUF types whose block scales are fp16, 4 holds Q4_K in two levels
# (uint8 scales / mins and fp16 super_scales), 5 keeps each shard of a fused layer whose
# shards' layouts differ in its own layout (``shard_<id>.qweight`` ..., ``sharded.py``), 6
# holds Q6_K in 6 bits (``native_int6.py``) where the CPU kernels read it, 7 Q5_0 in 5 bits
# (``native_int5.py``) likewise, 8 carries the output layer's ``block_abs_sum_max``
# (``layers/greedy_head.py``). It is part of the
# file name, so builds of different versions sharing one cache do not overwrite each other's
# entries.
NATIVE_FORMAT = "localchat-native-8"
_MIB = 1 << 20


def model_cache_key(path: Path) -> str:
    """``<stem>-<16 hex>`` identifying the weights at ``path`` (a ``.gguf`` file or an HF
    folder) without reading them whole."""
    from ..loader import is_gguf

    path = Path(path)
    if is_gguf(path):
        from ..loader.gguf import gguf_cache_key

        return gguf_cache_key(path)
    digest = hashlib.sha256(FORMAT.encode())
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for file in sorted(path.glob("*.safetensors")):
        size = file.stat().st_size
        digest.update(f"{file.name}|{size}".encode())
        with open(file, "rb") as f:
            digest.update(f.read(_MIB))
    return f"{path.name}-{digest.hexdigest()[:16]}"


def cache_path(cache_dir: Path, model_path: Path, scheme: str, group_size: int,
               dtype: torch.dtype, fmt: str = FORMAT) -> Path:
    """Where the quantized weights of ``model_path`` under ``scheme`` live in ``cache_dir``
    (a format other than :data:`FORMAT` adds its version to the name: ``...-v3``)."""
    dtype_name = str(dtype).removeprefix("torch.")
    version = "" if fmt == FORMAT else f"-v{fmt.rpartition('-')[2]}"
    name = (f"{model_cache_key(model_path)}-{scheme}-g{group_size}-{dtype_name}{version}"
            ".safetensors")
    return Path(cache_dir) / "quant" / name


# Writes started by save_quantized(background=True), by path; wait_saved joins them.
_PENDING: dict[Path, threading.Thread] = {}
# A temporary file of an interrupted write older than this is removed by the next write.
STALE_TMP_S = 3600


def save_quantized(model: nn.Module, path: Path, metadata: dict[str, str],
                   background: bool = False) -> None:
    """Write ``model.state_dict()`` (persistent tensors) to ``path`` atomically (a temporary
    file in the same folder, then a rename: a reader sees the whole file or none).

    ``background``: the state is taken now and written by a thread, so the first answer does
    not wait for the disk (1.1 GB took 3.2 s of a 1.5B model's 11.3 s first load here; the
    write releases the GIL). The thread is not a daemon: the interpreter waits for it at exit.
    A failure there is logged, as the callers log an ``OSError`` here, and the next load
    rebuilds. :func:`wait_saved` joins it (a load of the same path in this process does).
    The callers must not change the tensors in place afterwards (they replace them).

    Raises ``OSError`` (foreground) when the folder or the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, **metadata}
    if not background:
        _write(state, path, meta)
        return
    wait_saved(path)
    thread = threading.Thread(target=_write_logged, args=(state, path, meta),
                              name="localchat-cache-write")
    _PENDING[path] = thread
    thread.start()


def wait_saved(path: Path | None = None) -> None:
    """Block until a background :func:`save_quantized` of ``path`` (if any; None: of every
    path) has finished."""
    paths = list(_PENDING) if path is None else [path]
    for p in paths:
        thread = _PENDING.pop(p, None)
        if thread is not None:
            thread.join()


def entry_ready(path: Path) -> bool:
    """Whether the cache entry ``path`` can be read now: this process's own background write
    of it (if any) waited for, then the file there (what both loaders check first)."""
    wait_saved(path)
    return path.is_file()


def _write_logged(state: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    try:
        _write(state, path, meta)
    except Exception as exc:  # noqa: BLE001 - a full or read-only cache must not end anything
        logger.warning("could not write quantized cache %s: %s", path, exc)


def _write(state: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    from safetensors.torch import save_file

    _remove_stale_tmp(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file(state, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    mark_used(path)  # (and what it supersedes, unused for a day, goes)


def _remove_stale_tmp(path: Path) -> None:
    """Remove temporary files of earlier writes of ``path`` left by a process that was
    killed mid-write (older than :data:`STALE_TMP_S`; a younger one may be another process's
    write in progress)."""
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.*"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass


def load_quantized(model: nn.Module, path: Path) -> bool:
    """Copy the tensors of ``path`` into ``model``'s state (already allocated, same names,
    shapes and dtypes), one tensor at a time. Returns ``False`` (and logs why) when the file
    is missing, unreadable or does not match the model, leaving the caller to re-quantize."""
    from safetensors import safe_open

    if not path.is_file():
        return False
    state = model.state_dict()
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("format") != FORMAT or set(f.keys()) != set(state):
                logger.warning("quantized cache %s does not match the model; rebuilding", path)
                return False
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensor = f.get_tensor(name)
                target = state[name]
                if tensor.shape != target.shape or tensor.dtype != target.dtype:
                    logger.warning("quantized cache %s: %s differs; rebuilding", path, name)
                    return False
                target.copy_(tensor)
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors and OSError
        logger.warning("quantized cache %s unreadable (%s); rebuilding", path, exc)
        return False
    mark_used(path)
    return True


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I8": torch.int8, "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64,
              "F8_E4M3": torch.float8_e4m3fn}


def load_quantized_mmap(model: nn.Module, path: Path, copy_modules=frozenset(),
                        on_module_loaded=None, fmt: str = FORMAT) -> bool:
    """Like :func:`load_quantized`, but the tensors become views of a private (copy-on-write)
    memory map of ``path`` instead of copies: the cached weights cost page cache, not
    allocations. Tensors of modules named in ``copy_modules`` (those a device repack will
    replace, e.g. int4 for PyTorch's CPU kernel) are copied into their allocated storage
    instead, so no mapped page of theirs stays resident; ``on_module_loaded(module_name)``
    runs as soon as each module's tensors are all in (the caller repacks it there, one layer
    in flight). On a GPU model the tensors are read and copied into the device tensors the
    model holds (nothing stays mapped). Returns ``False`` (nothing replaced) when the file is
    unreadable or does not match the model's names, shapes, dtypes or format (``fmt``, the
    metadata's ``format``).
    """
    import json
    import mmap

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header_len = int.from_bytes(f.read(8), "little")
            if size < 8 or header_len > size - 8:  # a damaged length read no further
                raise ValueError(f"a header of {header_len} bytes in a file of {size}")
            try:
                header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError):  # (zeroed or overwritten)
                raise ValueError(f"its {header_len}-byte header is not JSON") from None
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        logger.warning("quantized cache %s unreadable (%s); rebuilding", path, exc)
        return False
    meta = header.pop("__metadata__", {}) or {}
    state = model.state_dict()
    if not isinstance(meta, dict) or meta.get("format") != fmt or set(header) != set(state):
        logger.warning("quantized cache %s does not match the model; rebuilding", path)
        return False
    base = 8 + header_len
    views = {}
    for name, info in header.items():
        target = state[name]
        try:
            dtype = _ST_DTYPES.get(info["dtype"])
            start, end = (int(v) for v in info["data_offsets"])
            shape = list(info["shape"])
        except (KeyError, TypeError, ValueError):
            logger.warning("quantized cache %s: the entry of %s is malformed; rebuilding",
                           path, name)
            return False
        if base + end > len(mm):
            logger.warning("quantized cache %s is truncated (%s ends past its %d bytes); "
                           "rebuilding", path, name, len(mm))
            return False
        if dtype != target.dtype or shape != list(target.shape) or start < 0 \
                or end - start != target.numel() * target.element_size():
            logger.warning("quantized cache %s: %s differs; rebuilding", path, name)
            return False
        views[name] = (base + start, end - start, dtype)
    modules = dict(model.named_modules())
    by_module: dict[str, list[str]] = {}
    for name in header:
        by_module.setdefault(name.rpartition(".")[0], []).append(name)
    import warnings

    try:
        reader = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        logger.warning("quantized cache %s unreadable (%s); rebuilding", path, exc)
        return False
    with reader:
        for module_name, names in by_module.items():
            module = modules[module_name]
            for name in names:
                offset, nbytes, dtype = views[name]
                attr = name.rpartition(".")[2]
                if nbytes == 0:
                    continue
                target = state[name]
                if target.device.type != "cpu":
                    # a GPU model: read into host memory, then into the device tensor the
                    # model allocated (a mapped view left on the CPU failed the first step)
                    target.copy_(_read_tensor(reader, offset, target))
                    continue
                if module_name in copy_modules:
                    # read, not mapped: a mapped page once touched would stay in the process's
                    # RSS for as long as the map lives, beside the repacked copy
                    t = _read_tensor(reader, offset, target)
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the map is copy-on-write: writable
                        t = torch.frombuffer(mm, dtype=dtype, count=nbytes // dtype.itemsize,
                                             offset=offset).view(state[name].shape)
                if attr in module._parameters:
                    module._parameters[attr] = nn.Parameter(t, requires_grad=False)
                else:
                    module._buffers[attr] = t
            if on_module_loaded is not None:
                on_module_loaded(module_name)
    mark_used(path)  # used now; what it supersedes, unused for a day, goes
    return True


def _read_tensor(reader, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A new tensor shaped and typed as ``like``, filled with the bytes of open file
    ``reader`` at ``offset`` (``like``'s own storage, allocated but never touched, is dropped
    with it: one layer's bytes in flight). Raises ``OSError`` on a short read."""
    t = torch.empty(like.shape, dtype=like.dtype)
    reader.seek(offset)
    buf = t.view(-1).view(torch.uint8).numpy()
    if reader.readinto(memoryview(buf)) != buf.nbytes:
        raise OSError(f"short read at offset {offset}")
    return t
