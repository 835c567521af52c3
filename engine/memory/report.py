"""Predicted vs measured memory of a loaded engine (README, Memory planning).

``memory_report(engine)`` re-plans the engine's actual configuration (its model config, dtype,
KV pool) with the planner's formulas and sets the prediction beside a measurement: on CUDA the
caching allocator's bytes in use (``torch.cuda.memory_allocated``; weights + KV), on CPU the
process's resident set (``VmRSS``; weights + KV + the runtime). ``localchat models --verbose``
and the stats view print it.

On CPU the KV pool is allocated with ``torch.empty``: the OS backs its pages only once they are
written, so right after loading ``measured`` is below the prediction by the untouched part of
the pool; it converges as conversations fill the context (``kv_resident`` says which case
the caller measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .budget import CPU_RUNTIME_OVERHEAD, process_rss_bytes
from .footprint import kv_bytes, weight_bytes

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class MemoryReport:
    """Bytes predicted by the planner and measured on the device, with the parts.

    ``predicted_bytes = weight_bytes + kv_bytes + overhead_bytes``; ``overhead_bytes`` is the
    CPU runtime baseline (0 on CUDA, where ``measured_bytes`` counts allocator bytes only).
    ``ratio = measured / predicted``.
    """

    device: str
    format: str
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    predicted_bytes: int
    measured_bytes: int
    measured_what: str

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes

    def summary(self) -> str:
        """One line for people: ``memory: predicted 1.02 GiB, measured 1.05 GiB (1.03x) ...``."""
        gib = 2**30
        return (f"memory: predicted {self.predicted_bytes / gib:.2f} GiB (weights "
                f"{self.weight_bytes / gib:.2f}, KV {self.kv_bytes / gib:.2f}, runtime "
                f"{self.overhead_bytes / gib:.2f}), measured {self.measured_bytes / gib:.2f} GiB "
                f"({self.measured_what}), {self.ratio:.2f}x")


def memory_report(engine) -> MemoryReport:
    """Predicted vs measured memory of a loaded ``LLMEngine`` (bytes).

    Reads ``engine.model_config``, ``engine.dtype``, ``engine.device``, ``engine.num_blocks``
    and ``engine.config.cache.block_size``; the weight format is ``engine.config.quant.scheme``
    (``auto``/``none``: the engine's dtype), the int4 group size that of the loaded layers.
    Raises ``ValueError`` for a dtype the planner does not know.
    """
    float_format = _DTYPE_NAMES.get(engine.dtype)
    if float_format is None:
        raise ValueError(f"no memory plan for dtype {engine.dtype}")
    scheme = getattr(getattr(engine.config, "quant", None), "scheme", "none")
    quantized = scheme not in ("auto", "none")
    tokens = engine.num_blocks * engine.config.cache.block_size
    group = next((m.quant_method.group_size for m in engine.runner.model.modules()
                  if hasattr(getattr(m, "quant_method", None), "group_size")), 128)
    weights = weight_bytes(engine.model_config, scheme if quantized else "none", engine.device,
                           engine.dtype, group)
    kv = kv_bytes(engine.model_config, tokens, engine.dtype)
    if engine.device.type == "cuda":
        overhead, measured = 0, int(torch.cuda.memory_allocated(engine.device))
        what = "CUDA allocator bytes in use"
    else:
        overhead, measured = CPU_RUNTIME_OVERHEAD, process_rss_bytes()
        what = "process RSS"
    return MemoryReport(engine.device.type, scheme if quantized else float_format, weights, kv,
                        overhead,
                        weights + kv + overhead, measured, what)
