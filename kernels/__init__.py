"""Data-plane ops: Triton kernels on CUDA, PyTorch references (``reference.py``) elsewhere.

Call the ops through this module so the dispatch stays in one place: a call whose first tensor
lives on a CUDA device runs the Triton launcher (``triton_*.py``, imported on first use);
anything else runs the reference. ``LOCALCHAT_KERNELS=reference`` forces the references
everywhere (feature-off baselines, debugging). The Triton modules are imported lazily so that
CPU-only installs never import Triton, and so that tests can import them under
``TRITON_INTERPRET=1`` themselves.

Ops: ``store_kv_cache``, ``paged_attention_decode``, ``prefill_attention``, ``rms_norm``,
``fused_add_rms_norm``, ``apply_rope``, ``int8_matmul``, ``int4_matmul``; shapes and contracts
in each reference's docstring (the Triton versions keep them).
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from . import reference

__all__ = [
    "apply_rope",
    "fused_add_rms_norm",
    "int4_matmul",
    "int8_matmul",
    "paged_attention_decode",
    "prefill_attention",
    "rms_norm",
    "store_kv_cache",
    "triton_available",
]


@functools.cache
def triton_available() -> bool:
    """True when Triton imports and ``LOCALCHAT_KERNELS`` does not force the references."""
    if os.environ.get("LOCALCHAT_KERNELS", "").lower() == "reference":
        return False
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_available()


@functools.cache
def _triton(module: str):
    return importlib.import_module(f".{module}", __name__)


def store_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """See ``reference.store_kv_cache``."""
    if _use_triton(key):
        return _triton("triton_kv").store_kv_cache(key, value, key_cache, value_cache,
                                                   slot_mapping)
    return reference.store_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale):
    """See ``reference.paged_attention_decode`` (split-K chosen by the Triton launcher)."""
    if _use_triton(query):
        return _triton("triton_decode").paged_attention_decode(
            query, key_cache, value_cache, block_tables, seq_lens, scale)
    return reference.paged_attention_decode(query, key_cache, value_cache, block_tables,
                                            seq_lens, scale)


def prefill_attention(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                      scale, max_query_len: int | None = None):
    """See ``reference.prefill_attention``. ``max_query_len`` (tokens, optional) spares the
    Triton launcher a device-to-host read; the reference ignores it."""
    if _use_triton(query):
        return _triton("triton_prefill").prefill_attention(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale,
            max_query_len=max_query_len)
    return reference.prefill_attention(query, key_cache, value_cache, query_start_loc,
                                       seq_lens, block_tables, scale)


def rms_norm(x, weight, eps):
    """See ``reference.rms_norm``."""
    if _use_triton(x):
        return _triton("triton_norm").rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(x, residual, weight, eps):
    """See ``reference.fused_add_rms_norm``; the Triton version updates ``x`` and
    ``residual`` in place (callers must not reuse them)."""
    if _use_triton(x):
        return _triton("triton_norm").fused_add_rms_norm(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def apply_rope(positions, query, key, cos_sin_cache):
    """See ``reference.apply_rope``."""
    if _use_triton(query):
        return _triton("triton_rope").apply_rope(positions, query, key, cos_sin_cache)
    return reference.apply_rope(positions, query, key, cos_sin_cache)


def int8_matmul(x, qweight, scales, mins=None, group_size: int | None = None):
    """See ``reference.int8_matmul`` (group-wise int8, optional ``mins``; ``group_size``
    None = ``K // scales.shape[1]``)."""
    if _use_triton(x):
        return _triton("triton_quant").int8_matmul(x, qweight, scales, mins, group_size)
    return reference.int8_matmul(x, qweight, scales, mins, group_size)


def int4_matmul(x, qweight, scales, mins, group_size: int):
    """See ``reference.int4_matmul`` (``w = q * scales + mins`` group-wise)."""
    if _use_triton(x):
        return _triton("triton_quant").int4_matmul(x, qweight, scales, mins, group_size)
    return reference.int4_matmul(x, qweight, scales, mins, group_size)
