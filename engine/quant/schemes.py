"""Weight formats (quantization schemes) and which device offers which.

A scheme names how the weights of the decoder layers' linear projections are stored; the
embedding, norms, biases and the LM head always stay in the unquantized floating format (see
``engine/quant/__init__.py``). The unquantized format is bf16 on CUDA; on CPU bf16 only where
the processor has native bf16 arithmetic (AVX-512 BF16 or AMX), fp32 elsewhere; fp16 on CUDA
GPUs older than sm_80.
"""

from __future__ import annotations

import enum
import functools
from pathlib import Path

import torch


class QuantScheme(str, enum.Enum):
    """Weight formats, best quality first.

    * ``NONE``: the unquantized floating dtype (:func:`default_float_dtype`).
    * ``FP8``: float8 e4m3 weights, one fp32 scale per output channel; activations scaled per
      token at run time; ``torch._scaled_mm``. CUDA with compute capability >= 8.9 only.
    * ``INT8``: W8A16, symmetric int8 per output channel (``engine/quant/int8.py``).
    * ``INT4``: W4A16, asymmetric 4-bit, group-wise along the input dim (``int4.py``).
    * ``NATIVE``: a GGUF's own quantization, repacked exactly per tensor (``native.py``,
      ``gguf_repack.py``), the embedding and LM head included; a float checkpoint loads as
      ``NONE``.
    """

    NONE = "none"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NATIVE = "native"

    @property
    def is_quantized(self) -> bool:
        return self is not QuantScheme.NONE


# The names (auto, native, none, fp8, int8, int4) live in the torch-free engine/config.py, so
# that checking a --quant value imports no torch.
from ..config import SCHEME_NAMES


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when ``/proc/cpuinfo`` lists ``avx512_bf16`` or ``amx_bf16`` (native bf16 dot
    products; without them PyTorch emulates bf16 GEMMs and fp32 is faster)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def auto_fp32_takes_a8(device: torch.device | str, requested: torch.dtype | None,
                       dtype: torch.dtype) -> bool:
    """Whether an engine's CPU decode matmuls over quantized weights take the integer-dot
    kernels (activations rounded to int8 per 32 columns, llama.cpp's Q8_0 blocks) although its
    activations are fp32: when fp32 was not asked for (``requested`` is None) but picked by
    :func:`default_float_dtype` because the CPU lacks native bf16 (AVX2, AVX-512 without
    BF16). On such a CPU bf16 activations would take them by default (``kernels.cpu_a8_enabled``)
    and the exact fp32-activation kernels do 2-3x their work (Qwen2.5-Coder-1.5B Q4_K_M on a
    2-core AMD EPYC (Zen 3, AVX2), 2 threads: a decode step 155 ms exact, 51 ms integer-dot).
    An explicit fp32 (``EngineConfig(dtype=torch.float32)``) keeps the exact kernels (the precise
    engine), as ``LOCALCHAT_CPU_A8=0`` does for every engine. Prefill (more
    than ``kernels.CPU_MAX_ROWS`` rows) is fp32 either way."""
    return torch.device(device).type == "cpu" and requested is None \
        and dtype == torch.float32


def cuda_float_dtype(capability: tuple[int, int]) -> torch.dtype:
    """The unquantized format of a CUDA GPU of compute ``capability`` ``(major, minor)``:
    bf16 from sm_80 (Ampere) on, fp16 before (Turing/Volta have no bf16 tensor cores; Triton
    and cuBLAS would emulate it or refuse)."""
    return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16


def default_float_dtype(device: torch.device | str) -> torch.dtype:
    """The unquantized format for ``device``: on CUDA :func:`cuda_float_dtype` of its compute
    capability (bf16 on sm_80+, fp16 before; bf16 when no GPU is visible, for a hypothetical
    one); on CPU bf16 with native bf16 arithmetic (:func:`cpu_has_native_bf16`), else fp32."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return torch.bfloat16
        return cuda_float_dtype(torch.cuda.get_device_capability(device))
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def fp8_supported(device: torch.device | str) -> bool:
    """FP8 e4m3 GEMMs (``torch._scaled_mm``) need CUDA compute capability >= 8.9."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def supported_schemes(device: torch.device | str) -> list[QuantScheme]:
    """Schemes offered on ``device``, best quality first (fp8 only on CUDA cc >= 8.9)."""
    return [s for s in QuantScheme if s is not QuantScheme.FP8 or fp8_supported(device)]


def resolve_scheme(name: str | QuantScheme, device: torch.device | str) -> QuantScheme:
    """Turn a user's ``--quant`` value into a scheme offered on ``device``.

    ``"auto"`` resolves to ``NONE`` here (``LLMEngine.from_path`` asks the planner first).
    Raises ``ValueError`` (one line, naming the value) for an unknown name or a scheme the
    device does not offer (fp8 off CUDA cc >= 8.9).
    """
    if isinstance(name, QuantScheme):
        scheme = name
    else:
        key = str(name).strip().lower()
        if key not in SCHEME_NAMES:
            choices = ", ".join(SCHEME_NAMES)
            raise ValueError(f"unknown quantization {name!r} (choose from {choices})")
        scheme = QuantScheme.NONE if key == "auto" else QuantScheme(key)
    if scheme not in supported_schemes(device):
        raise ValueError(
            f"quantization {scheme.value!r} is not available on {torch.device(device)} "
            "(fp8 needs a CUDA GPU of compute capability 8.9 or newer)"
        )
    return scheme
