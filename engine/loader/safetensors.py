"""Lazy, per-tensor reading of an HF safetensors checkpoint (never pickle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import ModelLoadError


def safetensors_files(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files of an HF folder, sorted.

    Raises ``ModelLoadError`` when there are none (e.g. a pickle-only checkpoint).
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no .safetensors weights in {folder} (pickled .bin checkpoints are not loaded)"
        )
    return files


def iter_safetensors(
    folder: Path, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` one tensor at a time, converted to ``dtype`` when given.

    Floating tensors are converted; integer tensors are yielded as stored. Memory stays near
    one tensor above the model (safetensors memory-maps the file).

    Raises ``ModelLoadError`` on a truncated or corrupt file, naming it.
    """
    for path in safetensors_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    tensor = f.get_tensor(name)
                    if dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    yield name, tensor
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own error types and OSError
            raise ModelLoadError(
                f"cannot read weights file {path}: truncated or corrupt ({exc})"
            ) from exc
