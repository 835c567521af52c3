"""numpy repack of GGUF Q5_0 blocks onto the engine's int5 layout (``kernels/cpu/qa5.h``).

The int5 layout holds Q5_0 exactly at the file's size (22 bytes per 32 weights, 5.5 bits per
weight), per weight row ``n`` (``K % 128 == 0``; ``u = q + 16`` in 0..31, ``q`` the Q5_0
value in -16..15):

- ``qlow`` uint8 ``[N, K // 2]``: the low 4 bits of ``u``, low nibble = even ``k``, high
  nibble = odd ``k`` (the int4 layout's nibble order: byte ``i`` of 128-column chunk ``c``
  holds columns ``128 c + 2 i`` and ``128 c + 2 i + 1``);
- ``qhigh`` uint8 ``[N, K // 8]``: the top bit of ``u``, 16 bytes per chunk ``c``: bytes
  0..7 a little-endian 64-bit mask whose bit ``i`` is the high bit of column ``128 c + 2 i``
  (the low nibble of qlow byte ``i``), bytes 8..15 the same for column ``128 c + 2 i + 1``
  (the high nibble). So the mask of a chunk's 64 qlow bytes is one AVX-512 ``kmask`` load;
- ``scales`` fp16 ``[N, K // 32]`` (Q5_0's ``d`` per 32 columns).

``w = (u - 16) * float(d)`` in fp32 (exact: 5 x 11 significant bits): ``gguf.quants.
dequantize``'s values bit for bit. :func:`repack_q5_0` is the fallback of the C++ op
``localchat.kernels.cpu.gguf_repack_q5`` (``kernels/cpu/qa5_ops.cpp``) and its test oracle.
Block format: ggml's ``block_q5_0`` (``d`` fp16, ``qh[4]`` = uint32 whose bit ``j`` is the high
bit of element ``j``, ``qs[16]``: element ``j < 16`` the low nibble of ``qs[j]``, element
``j + 16`` the high nibble), read from ``ggml-common.h`` and the ``gguf`` package's
``quants.py`` (not copied).
"""

from __future__ import annotations

import numpy as np

Q5_0_BLOCK = 32
Q5_0_BYTES = 22
INT5_CHUNK = 128  # columns per chunk of the layout (K must be a multiple)


def q5_0_values(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 blocks ``[nb, 22]`` uint8 -> ``u = q + 16`` ``[nb, 32]`` uint8 (0..31)."""
    qh = np.ascontiguousarray(blocks[:, 2:6]).view("<u4").reshape(-1, 1)
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = blocks[:, 6:22]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return (low | (high << 4)).astype(np.uint8)


def pack_int5(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``u [N, K]`` (0..31, ``K % 128 == 0``) -> ``(qlow [N, K // 2], qhigh [N, K // 8])``
    uint8 in the layout of the module docstring."""
    n, k = u.shape
    u = u.astype(np.uint8).reshape(n, k // INT5_CHUNK, 64, 2)  # [.., byte i, even / odd]
    qlow = (u[..., 0] & 0x0F) | ((u[..., 1] & 0x0F) << 4)
    top = (u >> 4) & 1  # [n, chunks, 64, 2]
    even = np.packbits(top[..., 0], axis=-1, bitorder="little")  # [n, chunks, 8]
    odd = np.packbits(top[..., 1], axis=-1, bitorder="little")
    qhigh = np.concatenate([even, odd], axis=-1)
    return qlow.reshape(n, k // 2).astype(np.uint8), qhigh.reshape(n, k // 8).astype(np.uint8)


def repack_q5_0(raw: np.ndarray, n: int, k: int, rows: np.ndarray | None = None):
    """GGUF Q5_0 tensor bytes -> ``(qlow, qhigh, scales)`` numpy arrays of the int5 layout
    (uint8 ``[n, k // 2]``, uint8 ``[n, k // 8]``, fp16 ``[n, k // 32]``).

    ``raw``: uint8, any shape, ``S`` source rows of ``k // 32`` blocks each; ``rows``
    (optional int ``[n]``): output row ``r`` takes source row ``rows[r]`` (without it
    ``S == n``). Raises ``ValueError`` on a ``k`` that is not a positive multiple of 128 or a
    bad byte count."""
    if k <= 0 or k % INT5_CHUNK:
        raise ValueError(f"repack_q5_0: K={k} is not a positive multiple of {INT5_CHUNK}")
    row_bytes = k // Q5_0_BLOCK * Q5_0_BYTES
    flat = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size % row_bytes:
        raise ValueError(f"repack_q5_0: {flat.size} bytes are not whole rows of {row_bytes}")
    src = flat.reshape(-1, row_bytes)
    if rows is not None:
        src = src[np.asarray(rows, dtype=np.int64)]
    elif len(src) != n:
        raise ValueError(f"repack_q5_0: {flat.size} bytes hold {len(src)} rows, not {n}")
    if len(src) != n:
        raise ValueError(f"repack_q5_0: rows has {len(src)} entries, not {n}")
    blocks = src.reshape(-1, Q5_0_BYTES)
    qlow, qhigh = pack_int5(q5_0_values(blocks).reshape(n, k))
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16).reshape(n, k // Q5_0_BLOCK)
    return qlow, qhigh, d.copy()
