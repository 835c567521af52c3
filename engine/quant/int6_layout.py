"""numpy repack of GGUF Q6_K blocks onto the engine's int6 layout (``kernels/cpu/qa6.h``).

The int6 layout holds Q6_K exactly at the file's size (6.5625 bits per weight), per weight row
``n`` (``K % 256 == 0``; ``u = q + 32`` in 0..63, ``q`` the Q6_K value in -32..31):

- ``qlow`` uint8 ``[N, K // 2]``: the low 4 bits of ``u``, low nibble = even ``k``, high
  nibble = odd ``k`` (the int4 layout's nibble order);
- ``qhigh`` uint8 ``[N, K // 4]``: the top 2 bits of ``u``, 32 bytes per 128-column chunk
  ``c``; byte ``j`` holds in bits 0-1 column ``128 c + 2 j``, bits 2-3 column
  ``128 c + 2 (j + 32)``, bits 4-5 column ``128 c + 2 j + 1``, bits 6-7 column
  ``128 c + 2 (j + 32) + 1``;
- ``scales`` int8 ``[N, K // 16]`` (Q6_K's sub-block scales) and ``super_scales`` fp16
  ``[N, K // 256]`` (Q6_K's ``d``).

``w = (u - 32) * (float(d) * float(sc))`` in fp32: ``gguf.quants.dequantize``'s values bit for
bit. :func:`repack_q6_k` is the fallback of the C++ op ``localchat.kernels.cpu.gguf_repack_q6``
(``kernels/cpu/qa6_ops.cpp``) and its test oracle. Block format: ggml's ``block_q6_K``
(``ql[128]``, ``qh[64]``, ``scales[16]`` int8, ``d`` fp16), read from ``ggml-common.h`` and the
``gguf`` package's ``quants.py`` (not copied).
"""

from __future__ import annotations

import numpy as np

Q6_K_BLOCK = 256
Q6_K_BYTES = 210


def q6_k_values(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks ``[nb, 210]`` uint8 -> ``u = q + 32`` ``[nb, 256]`` uint8 (0..63).
    Element ``128 h + 32 r + l`` of a block: low bits ``ql[64 h + 32 (r & 1) + l] >> 4 (r >> 1)``,
    high bits ``qh[32 h + l] >> 2 r``."""
    ql = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array(
        [0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    u = (ql & 0x0F).reshape(-1, 2, 4, 32) | ((qh & 0x03) << 4)
    return u.reshape(-1, Q6_K_BLOCK).astype(np.uint8)


def pack_int6(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``u [N, K]`` (0..63, ``K % 128 == 0``) -> ``(qlow [N, K // 2], qhigh [N, K // 4])``
    uint8 in the layout of the module docstring."""
    n, k = u.shape
    u = u.astype(np.uint8).reshape(n, k // 128, 64, 2)  # [.., byte i, even / odd]
    qlow = (u[..., 0] & 0x0F) | ((u[..., 1] & 0x0F) << 4)
    top = u >> 4
    first, second = top[:, :, :32], top[:, :, 32:]  # bytes j and j + 32 of the chunk
    qhigh = first[..., 0] | (second[..., 0] << 2) | (first[..., 1] << 4) | (second[..., 1] << 6)
    return qlow.reshape(n, k // 2).astype(np.uint8), qhigh.reshape(n, k // 4).astype(np.uint8)


def repack_q6_k(raw: np.ndarray, n: int, k: int, rows: np.ndarray | None = None):
    """GGUF Q6_K tensor bytes -> ``(qlow, qhigh, scales, super_scales)`` numpy arrays of the
    int6 layout (uint8 ``[n, k // 2]``, uint8 ``[n, k // 4]``, int8 ``[n, k // 16]``, fp16
    ``[n, k // 256]``).

    ``raw``: uint8, any shape, ``S`` source rows of ``k // 256`` blocks each; ``rows``
    (optional int ``[n]``): output row ``r`` takes source row ``rows[r]`` (without it
    ``S == n``). Raises ``ValueError`` on a bad ``k`` or byte count."""
    if k <= 0 or k % Q6_K_BLOCK:
        raise ValueError(f"repack_q6_k: K={k} is not a positive multiple of {Q6_K_BLOCK}")
    row_bytes = k // Q6_K_BLOCK * Q6_K_BYTES
    flat = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size % row_bytes:
        raise ValueError(f"repack_q6_k: {flat.size} bytes are not whole rows of {row_bytes}")
    src = flat.reshape(-1, row_bytes)
    if rows is not None:
        src = src[np.asarray(rows, dtype=np.int64)]
    elif len(src) != n:
        raise ValueError(f"repack_q6_k: {flat.size} bytes hold {len(src)} rows, not {n}")
    if len(src) != n:
        raise ValueError(f"repack_q6_k: rows has {len(src)} entries, not {n}")
    blocks = src.reshape(-1, Q6_K_BYTES)
    qlow, qhigh = pack_int6(q6_k_values(blocks).reshape(n, k))
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).reshape(n, k // 16)
    d = np.ascontiguousarray(blocks[:, 208:210]).view(np.float16).reshape(n, k // Q6_K_BLOCK)
    return qlow, qhigh, scales.copy(), d.copy()
