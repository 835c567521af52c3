"""Predicted vs measured memory of a loaded engine (README, Memory planning).

``memory_report(engine)`` re-plans the engine's actual configuration (its model config, dtype,
KV pool) with the planner's formulas and sets the prediction beside a measurement: on CUDA the
caching allocator's bytes in use (``torch.cuda.memory_allocated``; weights + KV), on CPU the
process's resident set (``VmRSS``; weights + KV + the runtime). ``ask --json`` reports it
(its ``memory`` object).

On CPU the KV pool is allocated with ``torch.empty``: the OS backs its pages only once they are
written, so right after loading ``measured`` is below the prediction by the untouched part of
the pool; it converges as conversations fill the context (``kv_resident`` says which case
the caller measured).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from .budget import CPU_RUNTIME_OVERHEAD, process_rss_bytes
from .footprint import INT4_GROUP_SIZE, kv_bytes, weight_bytes

_PLANNED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)



def allocated_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights and views counted
    once; meta tensors and non-tensors skipped)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def module_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor ``model`` holds: parameters, buffers, and tensors kept as plain module
    attributes (quantized weights, repacked layouts)."""
    out = list(model.parameters()) + list(model.buffers())
    out += [v for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    return out


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

    Re-plans what the engine reports it loaded (``engine.get_info()``: weight format, int4
    group size, dtype, device, KV pool) for ``engine.model_config``, plus the draft model's
    weights and KV pool when the engine speculates with one (``weight_bytes`` / ``kv_bytes``
    then cover both). Raises ``ValueError`` for a dtype the planner does not know.
    """
    info = engine.get_info()
    if info.dtype not in _PLANNED_DTYPES:
        raise ValueError(f"no memory plan for dtype {info.dtype}")
    tokens = info.num_blocks * info.block_size
    if info.weight_format == "native":
        # the GGUF's own quantization: exact bytes from its tensor table (loader/native.py)
        weights = engine.runner.model.native_weight_bytes
    else:
        weights = weight_bytes(engine.model_config,
                               info.weight_format if info.is_quantized else "none",
                               info.device, info.dtype, info.quant_group_size or INT4_GROUP_SIZE)
    kv_dtype = getattr(engine, "kv_dtype", info.dtype)  # the cache's own (fp16 under fp32 CPU)
    kv = kv_bytes(engine.model_config, tokens, kv_dtype)
    drafted = engine.draft_model()
    if drafted is not None:  # a draft model: its weights and its own KV pool, planned alike
        draft, draft_kv, draft_block_size = drafted
        if info.weight_format == "native":  # its file's own format; else what it holds
            weights += getattr(draft, "native_weight_bytes", None) or allocated_bytes(
                module_tensors(draft))
        else:
            weights += weight_bytes(draft.config,
                                    info.weight_format if info.is_quantized else "none",
                                    info.device, info.dtype,
                                    info.quant_group_size or INT4_GROUP_SIZE)
        draft_blocks = draft_kv[0].shape[1] if draft_kv else 0
        kv += kv_bytes(draft.config, draft_blocks * draft_block_size,
                       draft_kv[0].dtype if draft_kv else kv_dtype)
    if info.device.type == "cuda":
        overhead, measured = 0, int(torch.cuda.memory_allocated(info.device))
        what = "CUDA allocator bytes in use"
    else:
        overhead, measured = CPU_RUNTIME_OVERHEAD, process_rss_bytes()
        what = "process RSS"
    return MemoryReport(info.device.type, info.weight_format, weights, kv, overhead,
                        weights + kv + overhead, measured, what)
