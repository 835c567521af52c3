"""Data-plane ops: Triton kernels on CUDA, PyTorch references (``reference.py``) elsewhere.

The Triton kernels arrive with their own issue; until then every device uses the reference.
Call the ops through this module so the dispatch stays in one place.
"""

from __future__ import annotations

from .reference import (
    apply_rope,
    fused_add_rms_norm,
    paged_attention_decode,
    prefill_attention,
    rms_norm,
    store_kv_cache,
)

__all__ = [
    "apply_rope",
    "fused_add_rms_norm",
    "paged_attention_decode",
    "prefill_attention",
    "rms_norm",
    "store_kv_cache",
]
