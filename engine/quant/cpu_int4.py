"""CPU compute of int4 group-wise layers over the contract layout alone (one copy of the weight).

``qweight`` uint8 ``[N, K // 2]``, ``scales`` / ``mins`` ``[N, K // G]`` (fp32, or fp16 for
GGUF Q4_0 / Q4_1), ``w = q * scale + min``:

- up to ``localchat.kernels.CPU_MAX_ROWS`` rows (decode, draft verification):
  ``localchat.kernels.int4_matmul``: for bf16 / fp16 activations the integer-dot W4A8 kernel,
  for fp32 ones the exact C++ kernel (fp32 activations and accumulation); scales read in
  place, batch invariant either way (``kernels.cpu_a8_enabled`` has the policy);
- more rows (prefill): blocks of weight rows dequantized by the C++ ``int4_dequantize`` into
  the scratch buffer every layer shares (``cpu_prefill.py``, its block sizes too), each
  multiplied with ``torch.mm`` in the activations' precision: fp32 activations meet the
  exact fp32 weights; bf16 activations (the CPU float format where the CPU has native bf16)
  meet the weights rounded once to bf16, as the ``none`` format holds them, so the GEMM runs
  on the CPU's bf16 units (AMX / AVX-512 BF16: 2-4x PyTorch's int4pack kernel at 512 rows on
  one thread here, where the fp32 GEMM is 0.6-1.1x). vLLM's CPU backend and llama.cpp's
  prefill also dequantize tiles for a GEMM.

Used whenever the C++ kernels are built (:func:`own_kernels`); ``LOCALCHAT_CPU_INT4=int4pack``
(or no compiler) repacks for PyTorch's ``_weight_int4pack_mm_for_cpu`` instead (bf16 scales, a
second layout). Single-thread CPU time on this project's AVX-512 VNNI machine (a
microbenchmark timing each call with ``time.thread_time``, one run on the loaded machine, one
bf16 row, the integer-dot kernel that ``localchat.kernels`` dispatches by default):
17920 x 1536 0.38x int4pack's time, 1536 x 8960 0.40x, 960 x 576 0.66x; a 512-token SmolLM2
prefill 0.31x.
"""

from __future__ import annotations

import functools
import os

import torch

INT4_ENV = "LOCALCHAT_CPU_INT4"  # "int4pack": PyTorch's kernel; else localchat's own


def own_kernels() -> bool:
    """True when CPU int4 layers compute with localchat's kernels over the contract layout:
    the C++ kernels are built and ``LOCALCHAT_CPU_INT4`` is not ``int4pack`` (module
    docstring). Read once per process (``own_kernels.cache_clear()`` after changing the
    variable, as tests do); inside ``kernels.cpu.build.predict_only()`` (a plan) the
    prediction, not cached."""
    from localchat.kernels.cpu import build

    if build.predicting():
        return not _int4pack_asked() and build.expected()
    return _own_kernels()


def _int4pack_asked() -> bool:
    return os.environ.get(INT4_ENV, "").strip().lower() == "int4pack"


@functools.cache
def _own_kernels() -> bool:
    if _int4pack_asked():
        return False
    from localchat.kernels import cpu

    return cpu.available()


own_kernels.cache_clear = _own_kernels.cache_clear  # type: ignore[attr-defined]


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor, group_size: int,
                super_scales: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K]`` (fp32 / bf16 / fp16) @ the int4 weight ``[N, K]``.T -> ``[M, N]`` in
    ``x.dtype``, fp32 accumulation: the C++ matmul for ``M <= CPU_MAX_ROWS``, else the
    row-block GEMM (``super_scales``: two-level scales, ``int4.py``)."""
    from localchat import kernels

    if x.shape[0] <= kernels.CPU_MAX_ROWS:
        return kernels.int4_matmul(x, qweight, scales, mins, group_size, super_scales)
    return blockwise_int4(x, qweight, scales, mins, group_size, super_scales)


def blockwise_int4(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   mins: torch.Tensor, group_size: int,
                   super_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill: ``x [M, K] @ w.T`` with ``w`` dequantized a block of rows at a time into the
    shared scratch (``cpu_prefill.blockwise_mm``: at most ``MAX_BLOCK_BYTES`` of floats, no
    per-layer copy), in bf16 for bf16 ``x``, else fp32 (module doc). Output ``[M, N]`` in ``x.dtype``."""
    from localchat.kernels import cpu

    from .cpu_prefill import blockwise_mm

    def fill(a: int, b: int, w: torch.Tensor) -> None:
        sup = None if super_scales is None else super_scales[a:a + b]
        cpu.int4_dequantize(qweight[a:a + b], scales[a:a + b], mins[a:a + b], group_size, w,
                            sup)

    def amx(xb: torch.Tensor) -> torch.Tensor:
        return cpu.int4_dequant_mm(xb, qweight, scales, mins, group_size, super_scales)

    return blockwise_mm(x, qweight.shape[0], qweight.shape[1] * 2, fill, amx=amx,
                        key=qweight.data_ptr())
