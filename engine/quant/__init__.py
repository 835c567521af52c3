"""Quantized weights: schemes, quantize/pack maths, linear methods, the quantized-weight cache
(and the memory planner, ``planner.py``).

Formats: ``none`` (bf16 on CUDA and on CPUs with native bf16, fp32 otherwise), ``fp8`` (e4m3 per
output channel, CUDA cc >= 8.9), ``int8`` (W8A16 per output channel), ``int4`` (W4A16, groups of
128 along the input dim). Only the decoder layers' projections (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``) are quantized; the embedding, the LM head (tied to the
embedding in SmolLM2 and Qwen2.5), norms and biases stay in the float format, as llama.cpp keeps
its output matrix at higher precision. ``weight_bytes(model_config, scheme, device)`` gives the
exact bytes a loaded model's weights take per format.
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
from .sizes import weight_bytes

__all__ = [
    "SCHEME_NAMES",
    "QuantScheme",
    "cpu_has_native_bf16",
    "default_float_dtype",
    "fp8_supported",
    "resolve_scheme",
    "supported_schemes",
    "weight_bytes",
]
