"""What memory a device offers the planner: device traits, the budget, sizes, process RSS.

``DeviceSpec`` says which weight formats a device runs natively (bf16, fp8) and how many bytes
the runtime itself takes; ``default_budget_bytes`` is free memory minus a safety margin;
``parse_size`` reads ``12GiB``-style sizes for ``--memory``; ``process_rss_bytes`` is the
measurement side of predicted-vs-measured on CPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MiB, GiB = 2**20, 2**30
# The CUDA context, cuBLAS workspaces and the caching allocator's slack (~500 MiB, as vLLM and
# llama.cpp budget it).
CUDA_RUNTIME_OVERHEAD = 500 * MiB
# CPU: resident bytes of a Python process that imported torch and the engine and loaded a
# model from its caches, minus the model's weights and KV cache (measured with
# tests/engine/memory/test_planner.py::test_predicted_vs_measured_rss_smollm2 on the project
# machine: 270-320 MB across the four formats: torch, the tokenizer, the C++ kernels,
# allocator slack). A cached load no longer imports transformers (about 160 MB more, paid by
# a first load only).
CPU_RUNTIME_OVERHEAD = 288 * MiB
# Left free when the budget comes from the device: at least this, or this fraction.
_MARGIN_MIN = {"cpu": 1 * GiB, "cuda": 256 * MiB}
_MARGIN_FRACTION = {"cpu": 0.10, "cuda": 0.05}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20,
          "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


@dataclass(frozen=True)
class DeviceSpec:
    """A device as the planner sees it.

    ``type`` is ``cpu`` or ``cuda``; ``native_bf16``: bf16 is the unquantized format (CUDA
    sm_80+; a CPU with AVX-512 BF16 or AMX), else fp16 on CUDA and fp32 on CPU; ``fp8``: FP8
    e4m3 GEMMs (CUDA compute capability >= 8.9); ``runtime_overhead_bytes``: bytes the runtime holds besides the model;
    ``hypothetical``: planned for a device this machine does not have (``note`` says so).
    """

    type: str
    name: str
    native_bf16: bool
    fp8: bool
    runtime_overhead_bytes: int
    hypothetical: bool = False
    note: str | None = None

    @classmethod
    def detect(cls, kind: str = "cpu", *, allow_hypothetical: bool = False) -> DeviceSpec:
        """Describe this machine's ``kind`` device (``cpu`` or ``cuda``).

        Without CUDA, ``cuda`` gives a hypothetical CUDA device (bf16, no fp8) when
        ``allow_hypothetical``, else raises ``ValueError``.
        """
        if kind == "cpu":
            from ..quant.schemes import cpu_has_native_bf16  # imports torch: not at CLI start

            return cls("cpu", "CPU", cpu_has_native_bf16(), False, CPU_RUNTIME_OVERHEAD)
        if kind != "cuda":
            raise ValueError(f"unknown device {kind!r} (cpu or cuda)")
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            # native_bf16 False on CUDA means fp16 (pre-sm_80: schemes.cuda_float_dtype)
            return cls("cuda", torch.cuda.get_device_name(), (major, minor) >= (8, 0),
                       (major, minor) >= (8, 9),
                       CUDA_RUNTIME_OVERHEAD)
        if not allow_hypothetical:
            raise ValueError("no CUDA device on this machine; pass --memory SIZE to plan for one")
        return cls("cuda", "hypothetical CUDA device", True, False, CUDA_RUNTIME_OVERHEAD,
                   hypothetical=True,
                   note="planned for a hypothetical CUDA device (bf16; fp8 not assumed)")


def available_memory_bytes(kind: str = "cpu") -> int:
    """Free bytes now: CUDA ``torch.cuda.mem_get_info`` free, or Linux ``MemAvailable``
    (falling back to free physical pages). Raises ``ValueError`` for CUDA without a GPU."""
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("no CUDA device on this machine; pass --memory SIZE to plan for one")
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def default_budget_bytes(kind: str = "cpu", available: int | None = None) -> int:
    """The planner's budget when ``--memory`` is not given: available bytes minus a margin
    (CPU: max(1 GiB, 10%); CUDA: max(256 MiB, 5%)), never below 0."""
    free = available_memory_bytes(kind) if available is None else available
    margin = max(_MARGIN_MIN[kind], int(free * _MARGIN_FRACTION[kind]))
    return max(0, free - margin)


def parse_size(text: str) -> int:
    """Bytes from a size such as ``12GiB``, ``500MiB``, ``1.5 GB``, ``16G`` or ``1024``.

    Decimal units (``k``, ``MB``, ``G``) are powers of 1000, binary ones (``KiB``, ``Gi``)
    powers of 1024. Raises ``ValueError`` with a one-line message for anything else or 0.
    """
    m = _SIZE_RE.match(text or "")
    unit = (m.group(2) or "").lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}; write e.g. 12GiB, 500MiB or 16GB")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def process_rss_bytes() -> int:
    """Resident set size of this process (bytes), from ``/proc/self/status`` (Linux) or
    ``resource.getrusage`` peak as a fallback elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
