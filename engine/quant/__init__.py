"""Quantized weights: schemes, quantize/pack maths, linear methods, the quantized-weight cache.

Formats: ``none`` (bf16 on CUDA and on CPUs with native bf16, fp32 otherwise), ``fp8`` (e4m3 per
output channel, CUDA cc >= 8.9), ``int8`` (W8A16 per output channel), ``int4`` (W4A16, groups of
128 along the input dim). Only the decoder layers' projections (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``) are quantized; the embedding, the LM head (tied to the
embedding in SmolLM2 and Qwen2.5), norms and biases stay in the float format, as llama.cpp keeps
its output matrix at higher precision. The bytes each format takes are counted in
``engine/memory/footprint.py`` (``weight_bytes``), from the linear methods' ``weight_bytes``.
"""

from .schemes import (
    SCHEME_NAMES,
    QuantScheme,
    cpu_has_native_bf16,
    default_float_dtype,
    fp8_supported,
    resolve_scheme,
    supported_schemes,
)

__all__ = [
    "SCHEME_NAMES",
    "QuantScheme",
    "cpu_has_native_bf16",
    "default_float_dtype",
    "fp8_supported",
    "resolve_scheme",
    "supported_schemes",
]
