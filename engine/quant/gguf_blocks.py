"""numpy decoding of GGUF quantized blocks: the reference of the engine's GGUF repack.

``decode_blocks(name, blocks)`` turns a type's blocks into their integers, per-group fp32
scales and mins (``w = q * scale (+ min)``), each product exact in fp32 and the only rounding
the final ``+ min``, as ``gguf.quants.dequantize`` does. ``gguf_repack.py`` packs them onto the
engine's layouts where the C++ op (``kernels/cpu/repack_ops.cpp``) is not built, and the C++
op is tested bit-equal to it. Block formats: ggml's ``ggml-common.h`` / ``ggml-quants.c`` and
the ``gguf`` package's ``quants.py`` (read, not copied).
"""

from __future__ import annotations

import numpy as np

QK_K = 256

_IQ4_NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)


def _f16(b: np.ndarray) -> np.ndarray:
    """``[nb, 2]`` uint8 -> ``[nb, 1]`` fp32 (little-endian fp16 values)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """``[nb, ..., B]`` bytes -> ``[nb, ..., 2 B]`` uint8: low nibbles then high nibbles
    (ggml's order for a 2B-weight run)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 packed bytes -> (6-bit scales, 6-bit mins), each ``[nb, 8]`` uint8."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_low4(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K ``qs`` ``[nb, 128]`` -> ``[nb, 8, 32]`` low 4 bits (each 32-byte run holds
    sub-block 2j in its low nibbles and 2j + 1 in its high nibbles)."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 8, 32)


def _bits(words: np.ndarray, count: int) -> np.ndarray:
    """``[nb, count // 8]`` uint8 -> ``[nb, count]`` uint8 bits, little-endian bit order."""
    return np.unpackbits(words, axis=-1, bitorder="little")[:, :count]


def q4_k_two_level(b: np.ndarray):
    """Q4_K blocks ``[nb, 144]`` uint8 -> the two-level form the engine holds them in
    (``localchat.kernels.reference.fold_kscales``): ``(q [nb, 256] uint8 in 0..15, sc [nb, 8]
    uint8, m [nb, 8] uint8, sup [nb, 2] fp16 = (d, -dmin))``, the file's values unchanged
    (``-dmin`` by its sign bit)."""
    sc, mn = _k_scale_min(b[:, 4:16])
    sup = np.ascontiguousarray(b[:, 0:4]).view(np.uint16) ^ np.array([0, 0x8000], np.uint16)
    return _k_low4(b[:, 16:144]).reshape(len(b), QK_K), sc, mn, sup.view(np.float16)


def decode_blocks(name: str, b: np.ndarray):
    """Blocks ``[nb, type_size]`` uint8 -> ``(q [nb, block] integer array, scale [nb, groups]
    fp32, min [nb, groups] fp32 or None)``."""
    if name == "Q4_0":
        d = _f16(b[:, 0:2])
        return _nibbles_split(b[:, 2:18]), d, -8.0 * d
    if name == "Q4_1":
        return _nibbles_split(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])
    if name == "IQ4_NL":
        return _IQ4_NL_VALUES[_nibbles_split(b[:, 2:18])], _f16(b[:, 0:2]), None
    if name == "Q8_0":
        return np.ascontiguousarray(b[:, 2:34]).view(np.int8), _f16(b[:, 0:2]), None
    if name in ("Q5_0", "Q5_1"):
        off = 2 if name == "Q5_0" else 4
        high = _bits(np.ascontiguousarray(b[:, off:off + 4]), 32)
        q = (_nibbles_split(b[:, off + 4:off + 20]) | (high << 4)).astype(np.int8)
        if name == "Q5_0":
            return q - 16, _f16(b[:, 0:2]), None
        return q, _f16(b[:, 0:2]), _f16(b[:, 2:4])
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scale_min(b[:, 4:16])
        scale = d * sc.astype(np.float32)
        mins = -(dmin * mn.astype(np.float32))
        if name == "Q4_K":
            q = _k_low4(b[:, 16:144])
        else:
            qh = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            q = _k_low4(b[:, 48:176]) | ((qh & 1) << 4)
        return q.reshape(len(b), QK_K), scale, mins
    if name == "Q6_K":
        ql = b[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
            1, 1, 4, 1)
        q = ((ql & 0x0F).reshape(-1, 8, 32) | ((qh & 0x03).reshape(-1, 8, 32) << 4))
        sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
        return q.astype(np.int8).reshape(len(b), QK_K) - 32, _f16(b[:, 208:210]) * sc, None
    if name == "Q3_K":
        hmask, qs, packed, d = b[:, 0:32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
        low = (packed[:, 0:8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1))
        high = (packed[:, 8:12].reshape(-1, 1, 4)
                >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1))
        sc = (low.reshape(-1, 16) & 0x0F) | ((high.reshape(-1, 16) & 0x03) << 4)
        scale = d * (sc.astype(np.int8) - 32).astype(np.float32)
        ql = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1))
        qh = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        q = (ql & 3).reshape(-1, 8, 32).astype(np.int8) - ((qh ^ 1) << 2).astype(np.int8)
        return q.reshape(len(b), QK_K), scale, None
    if name == "Q2_K":
        sc, qs, d, dmin = b[:, 0:16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
        q = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1))
        q = (q & 3).reshape(len(b), QK_K)
        return q, d * (sc & 0x0F).astype(np.float32), -(dmin * (sc >> 4).astype(np.float32))
    raise AssertionError(name)
