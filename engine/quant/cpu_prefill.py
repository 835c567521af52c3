"""Prefill GEMMs of quantized CPU layers: weight rows dequantized a block at a time into ONE
scratch buffer shared by every layer, each block multiplied with ``torch.mm``.

For ``M > localchat.kernels.CPU_MAX_ROWS`` activation rows (fp32 ones beyond
``SHORT_PREFILL_MAX_ROWS`` where the layer has exact C++ row kernels: shorter prompts run as
16-row chunks on those, ``kernels.short_prefill_chunks``) a GEMM is compute bound, so the
weight is best turned back into floats (into a bounded scratch, never a float copy per layer)
and handed to the CPU's fastest GEMM: in bf16 when the activations are bf16 (the ``none`` format's
precision; oneDNN / MKL run it on AMX or AVX-512 BF16 units where the CPU has them), else in
fp32. vLLM's CPU backend and llama.cpp's prefill also dequantize tiles for a GEMM. The fill
functions are the C++ ``int4_dequantize`` / ``int8_dequantize`` (``localchat.kernels.cpu``),
or, without the C++ kernels, PyTorch ops (:func:`torch_int8_prefill`, fp32 only).

Blocks: the whole weight in ONE block when its float copy fits ``MAX_BLOCK_BYTES`` (32 MiB:
every layer of Qwen2.5-Coder-0.5B and -1.5B in bf16), else blocks of that size. Each block is
two parallel regions (the dequantization, the GEMM), and on a loaded 2-core machine every
extra region costs milliseconds of waiting for the other core: at 2 threads there, 512 rows,
Qwen2.5-0.5B's 4864 x 896 MLP took 1.3x the bf16 ``torch.mm``'s time in one block against
4-10x in blocks of 256-2432 rows (on one thread the block size hardly matters). Each block's
product is ``x @ w_block.T``, written by the GEMM straight into the ``[M, N]`` result or its
block of columns (``torch.mm(..., out=view)``: BLAS writes with the result's row stride):
never a transposed ``[N, M]`` product (transposing a 4864 x 512 bf16 result took as long as
its GEMM), nor a temporary copied into place (fp32, 2 threads, AVX2 EPYC, 512 rows of
Qwen2.5-Coder-1.5B's 17920 x 1536 gate/up weight in four 32 MiB blocks: 369 ms with the
copies, 305 ms without, against 287 ms for the dequantization and one ``torch.mm`` on the
whole float weight; the copies wrote into the freshly allocated result, page faults and
all). The blocks are evened out (a 17920-row weight in 4 blocks of 4480 rather than 3 of
5461 and a thin one of 1537). The model runs one layer at a time, so one buffer
serves every layer (:func:`scratch`; one per thread, so two engines stepping in two threads
never share one).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

MAX_BLOCK_BYTES = 32 << 20

# Activation rows up to which a bf16 prefill GEMM takes the AMX strip kernel where the CPU has
# one (``localchat.kernels.cpu.amx``: each weight read once in its quantized form, dequantized
# in cache, multiplied on the tile unit). Measured on a 2-core Sapphire Rapids VM, 2 threads,
# against these row blocks + ``torch.mm`` (oneDNN on AMX), Qwen2.5-Coder-1.5B's and -0.5B's
# shapes and layouts: 1.3-3.1x as fast at 17 rows, 1.05-1.7x at 128, 0.74-1.13x at 256 and
# 0.65-0.92x at 512 (oneDNN's blocking wins once the GEMM is compute bound).
AMX_MAX_ROWS = 128

_local = threading.local()  # .scratch: this thread's buffer; .held: see shared_dequantization

# fill(row0, rows, w): rows [row0, row0 + rows) of the weight into ``w [rows, K]`` (fp32 or
# bf16, contiguous)
Fill = Callable[[int, int, torch.Tensor], None]


def scratch(nbytes: int) -> torch.Tensor:
    """A flat uint8 scratch tensor of at least ``nbytes`` bytes, shared by every layer that
    runs in the calling thread and grown only when a larger one is needed (view it as the
    dtype needed)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < nbytes:
        _local.scratch = buf = None  # (free the old one first)
        _local.scratch = buf = torch.empty(-(-nbytes // 64) * 64, dtype=torch.uint8)
    return buf


@contextlib.contextmanager
def shared_dequantization() -> Iterator[None]:
    """Within this context (the calling thread), every weight block :func:`blockwise_mm`
    dequantizes for a call that names its weight (``key``) is kept in a tensor of its own and
    reused by later calls on the same weight, until the context exits: for several forwards
    run one layer at a time (``LlamaModel.forward_groups``: a CPU step's prompts that each
    compute alone), one dequantization per weight instead of one per forward, and the same
    floats, so the same products. Holds one layer's weights in floats while it lasts (the
    1.5B's largest layer: 93 MB in bf16)."""
    old = getattr(_local, "held", None)
    _local.held = {}
    try:
        yield
    finally:
        _local.held = old


def _weight_block(key: object, a: int, b: int, k: int, dt: torch.dtype,
                  fill: Fill) -> torch.Tensor:
    """Rows ``[a, a + b)`` of the weight as ``[b, k]`` ``dt``: the kept copy inside
    :func:`shared_dequantization` (filled on first use), else filled into the scratch."""
    held = getattr(_local, "held", None)
    if held is None or key is None:
        w = scratch(b * k * dt.itemsize).view(dt)[:b * k].view(b, k)
        fill(a, b, w)
        return w
    w = held.get((key, a, b, dt))
    if w is None:
        w = held[(key, a, b, dt)] = torch.empty(b, k, dtype=dt)
        fill(a, b, w)
    return w


def gemm_dtype(x: torch.Tensor) -> torch.dtype:
    """The precision of the blocks' GEMM for activations ``x``: bf16 for bf16, else fp32."""
    return torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32


def block_rows(n: int, k: int, dtype: torch.dtype) -> int:
    """Weight rows per block for an ``[n, k]`` weight dequantized to ``dtype``: all ``n`` when
    they fit ``MAX_BLOCK_BYTES``, else as many as do (at least 1)."""
    return max(1, min(n, MAX_BLOCK_BYTES // (k * dtype.itemsize)))


def amx_rows(x: torch.Tensor, k: int) -> bool:
    """Whether the prefill GEMM of ``x [M, k]`` takes the AMX strip kernel: bf16 ``x`` of at
    most :data:`AMX_MAX_ROWS` rows, ``k % 32 == 0``, and a CPU whose AMX the kernels use
    (``localchat.kernels.cpu.amx_enabled``; ``LOCALCHAT_CPU_AMX=0`` turns it off)."""
    if x.dtype != torch.bfloat16 or x.shape[0] > AMX_MAX_ROWS or k % 32:
        return False
    from localchat.kernels import cpu

    return cpu.amx_enabled()


def blockwise_mm(x: torch.Tensor, n: int, k: int, fill: Fill,
                 dtype: torch.dtype | None = None,
                 amx: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 key: object = None, align: int = 1,
                 invariant: bool = False) -> torch.Tensor:
    """``x [M, K] @ w.T`` for a weight ``w [n, k]`` that ``fill`` dequantizes a block of rows
    at a time into the shared scratch, in ``dtype`` (default :func:`gemm_dtype`: bf16 for
    bf16 ``x``, else fp32; the GEMM runs in that dtype with torch's accumulation, fp32 for
    bf16). Output ``[M, n]`` in ``x.dtype``. ``amx``, the layout's ``*_dequant_mm`` bound to
    its weight (``x [M, K]`` bf16 contiguous -> ``[M, n]`` bf16), replaces both where
    :func:`amx_rows` says so (same dequantized bf16 weights, fp32 accumulation). ``key``
    names the weight (its packed tensor's address) for :func:`shared_dequantization`;
    blocks start at multiples of ``align`` rows (a panel layout's 16-row tiles).
    ``invariant``: each block through ``kernels.cpu.float_matmul`` instead (batch invariant:
    a row's bits do not depend on the other rows, where BLAS takes another path for one row;
    for a few rows)."""
    if amx is not None and dtype is None and amx_rows(x, k) and not invariant:
        return amx(x.contiguous())
    dt = gemm_dtype(x) if dtype is None else dtype
    xd = x.to(dt)
    rows = block_rows(n, k, dt)
    if rows == n and not invariant:
        return torch.mm(xd, _weight_block(key, 0, n, k, dt, fill).t()).to(x.dtype)
    out = torch.empty(x.shape[0], n, dtype=dt)
    blocks = -(-n // rows)
    rows = -(-n // blocks)  # even blocks: no thin last GEMM
    rows = max(align, rows // align * align)
    if invariant:
        from localchat.kernels import cpu
    for a in range(0, n, rows):
        b = min(rows, n - a)
        w = _weight_block(key, a, b, k, dt, fill)
        if invariant:
            out[:, a:a + b] = cpu.float_matmul(xd, w)
        else:  # straight into the result's columns (BLAS writes with ldc = n): no temporary
            torch.mm(xd, w.t(), out=out[:, a:a + b])
    return out.to(x.dtype)


def cpp_prefill(rows: int) -> bool:
    """Whether a CPU matmul over ``rows`` activation rows takes the C++ row-block prefill:
    more than ``localchat.kernels.CPU_MAX_ROWS`` rows and the C++ kernels built."""
    from localchat import kernels
    from localchat.kernels import cpu

    return rows > kernels.CPU_MAX_ROWS and cpu.available()


def int8_prefill(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 mins: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """``x [M, K]`` (fp32 / bf16 / fp16) @ the group-wise int8 weight (``qweight int8 [N, K]``,
    contiguous fp32 / fp16 ``scales`` / ``mins [N, K // group_size]``, ``mins`` may be None)
    -> ``[M, N]`` in ``x.dtype``: blocks dequantized by the C++ ``int8_dequantize`` (exact
    fp32 weights, or those rounded once to bf16 for bf16 ``x``), then :func:`blockwise_mm`.
    Needs the C++ kernels (``localchat.kernels.cpu.available()``)."""
    from localchat.kernels import cpu

    def fill(a: int, b: int, w: torch.Tensor) -> None:
        cpu.int8_dequantize(qweight[a:a + b], scales[a:a + b],
                            None if mins is None else mins[a:a + b], group_size, w)

    def amx(xb: torch.Tensor) -> torch.Tensor:
        return cpu.int8_dequant_mm(xb, qweight, scales, mins, group_size)

    return blockwise_mm(x, qweight.shape[0], qweight.shape[1], fill, amx=amx,
                        key=qweight.data_ptr())


def torch_int8_prefill(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       mins: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """:func:`int8_prefill` without the C++ kernels: each block dequantized with PyTorch ops
    (``q * scale (+ min)`` in fp32, the reference's values) and multiplied in fp32 whatever
    ``x``'s dtype. Output ``[M, N]`` in ``x.dtype``."""
    k = qweight.shape[1]
    g = group_size

    def fill(a: int, b: int, w: torch.Tensor) -> None:
        w.copy_(qweight[a:a + b])
        wg = w.view(b, k // g, g)
        wg.mul_(scales[a:a + b, :, None])
        if mins is not None:
            wg.add_(mins[a:a + b, :, None])

    return blockwise_mm(x, qweight.shape[0], k, fill, torch.float32, key=qweight.data_ptr())
