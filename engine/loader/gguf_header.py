"""A GGUF file's header read in one pass: metadata key/values and the tensor table.

``gguf.GGUFReader`` builds a numpy memmap view for every metadata value, so a 151k-token
vocabulary (tokens and merges: ~900k values) takes 13 s to parse on this project's 2-core CPU,
and transformers' config conversion parses the file again with it. This reader walks the same
bytes with ``struct`` over one ``mmap`` (about 0.1-0.3 s for the same file) and returns plain
Python values; block sizes and byte shapes of the tensor types still come from the ``gguf``
package (``GGML_QUANT_SIZES``, ``quant_shape_to_byte_shape``). ``gguf.GGUFReader`` is its test
oracle (``tests/engine/loader/test_gguf_header.py``).

Format: ggml's ``docs/gguf.md`` (little-endian; magic ``GGUF``, version 2 or 3, tensor and
key/value counts as u64, the key/values, the tensor infos, then the data section aligned to
``general.alignment``, default 32).
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# GGUF metadata value types -> struct format of one scalar (8 = string, 9 = array)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_GGUF_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32


def check_gguf_header(path: Path) -> None:
    """Raise ``ModelLoadError`` unless ``path`` starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic {magic!r})")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor-table entry.

    ``dims`` in GGUF order (fastest-varying first: HF shape reversed); ``ggml_type`` the GGML
    type number; ``offset`` the absolute byte offset of its data in the file; ``n_bytes`` its
    size in bytes (elements / block size x type size).
    """

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """``metadata``: key -> value (int, float, bool, str, or a list of those for arrays; in
    file order); ``tensors``: the tensor table in file order; ``data_offset``: where the
    aligned data section starts (bytes); ``file_size`` in bytes."""

    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensorInfo]
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str:
        """``general.architecture`` ("" when absent)."""
        value = self.metadata.get("general.architecture", "")
        return value if isinstance(value, str) else ""


class _Cursor:
    """Sequential little-endian reads over a buffer; any read past its end raises
    ``_Truncated``."""

    def __init__(self, buf) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def unpack(self, fmt: str) -> Any:
        s = struct.Struct(fmt)
        if self.pos + s.size > self.size:
            raise _Truncated
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > self.size:
            raise _Truncated
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            return self.array(etype, count)
        fmt = _SCALAR.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown metadata value type {vtype}")
        return self.unpack(fmt)

    def array(self, etype: int, count: int) -> list:
        if etype == _STRING:
            out = []
            buf, pos, size = self.buf, self.pos, self.size
            length = struct.Struct("<Q")
            for _ in range(count):
                if pos + 8 > size:
                    raise _Truncated
                (n,) = length.unpack_from(buf, pos)
                pos += 8
                if pos + n > size:
                    raise _Truncated
                out.append(buf[pos:pos + n].decode("utf-8", errors="replace"))
                pos += n
            self.pos = pos
            return out
        fmt = _SCALAR.get(etype)
        if fmt is None:  # nested arrays: rare, read element by element
            return [self.value(etype) for _ in range(count)]
        s = struct.Struct(f"<{count}{fmt[1]}")
        if self.pos + s.size > self.size:
            raise _Truncated
        values = list(s.unpack_from(self.buf, self.pos))
        self.pos += s.size
        return values


class _Truncated(Exception):
    pass


def read_gguf_header(path: Path) -> GGUFHeader:
    """Parse the metadata and tensor table of GGUF ``path`` (no tensor data is read; the
    result of a file whose size and modification time are unchanged is reused: treat it as
    read-only).

    Raises ``ModelLoadError`` (one line naming the file) for a missing or unreadable file, a
    bad magic, an unsupported version, a header that runs past the end of the file, an
    unknown value type, a tensor whose data lies past the end of the file, or duplicate
    tensor names.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _read_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFHeader:
    """One parse per file version per process: a first load asks for the header three
    times (tensor table, config, tokenizer type). ``size`` and ``mtime_ns`` key the entry."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise ModelLoadError(f"cannot read GGUF file {path}: truncated ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(path, mm, size, GGML_QUANT_SIZES, GGMLQuantizationType)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _parse(path: Path, buf, size: int, quant_sizes, qtype) -> GGUFHeader:
    """Parse ``buf`` (the whole file: an ``mmap`` or ``bytes``) into a ``GGUFHeader``."""
    cur = _Cursor(buf)
    bad = f"cannot read GGUF file {path}"
    try:
        if bytes(buf[0:4]) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic {bytes(buf[0:4])!r})")
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in _VERSIONS:
            raise ModelLoadError(f"{bad}: GGUF version {version} is not supported "
                                 f"(supported: {', '.join(map(str, _VERSIONS))})")
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")
        if n_tensors > size or n_kv > size:
            raise ModelLoadError(f"{bad}: its header or metadata is corrupt ({n_tensors} "
                                 f"tensors, {n_kv} metadata keys in a {size}-byte file)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"))
        raw_tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if n_dims > 8:
                raise ModelLoadError(f"{bad}: tensor {name} has {n_dims} dimensions")
            dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
            raw_tensors.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    except _Truncated:
        raise ModelLoadError(f"{bad}: truncated, or its header or metadata is corrupt (a "
                             "value runs past the end of the file)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{bad}: its header or metadata is corrupt ({exc})") from None
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"{bad}: invalid general.alignment {alignment!r}")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors: list[GGUFTensorInfo] = []
    seen: set[str] = set()
    for name, dims, ggml_type, rel in raw_tensors:
        if name in seen:
            raise ModelLoadError(f"{bad}: duplicate tensor {name}")
        seen.add(name)
        try:
            block, type_size = quant_sizes[qtype(ggml_type)]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{bad}: tensor {name} has unknown GGML type {ggml_type}") \
                from None
        n_elements = 1
        for d in dims:
            n_elements *= d
        n_bytes = n_elements * type_size // block
        offset = data_offset + rel
        if offset + n_bytes > size:
            raise ModelLoadError(f"{bad}: truncated at tensor {name}")
        tensors.append(GGUFTensorInfo(name, ggml_type, dims, offset, n_bytes))
    return GGUFHeader(version, metadata, tensors, data_offset, size)


def numpy_view_spec(info: GGUFTensorInfo) -> tuple[str, list[int]]:
    """``(numpy dtype str, shape)`` under which ``gguf.GGUFReader`` exposes this tensor's
    bytes (what ``gguf.quants.dequantize`` takes): float/int types as their values in HF
    order, block types as uint8 rows of whole blocks."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import quant_shape_to_byte_shape

    shape = tuple(reversed(info.dims))
    plain = {Q.F16: np.float16, Q.F32: np.float32, Q.F64: np.float64, Q.I8: np.int8,
             Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}
    qt = Q(info.ggml_type)
    if qt in plain:
        return np.dtype(plain[qt]).str, list(shape)
    return np.dtype(np.uint8).str, list(quant_shape_to_byte_shape(shape, qt))
