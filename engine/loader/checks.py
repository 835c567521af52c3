"""Sanity checks on checkpoint weights as they stream in.

A file whose tensor data is damaged (random bytes where the weights were) still parses: GGUF
blocks dequantize to whatever their bytes say, and fp16 scales hit the all-ones exponent
(NaN/Inf) often. Such a model then "answers" empty text. ``check_finite`` rejects it at load
time, naming the first bad tensor, instead (llama.cpp's loader validates tensor data the same
way on request: ``--check-tensors``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..errors import ModelLoadError


def check_finite(name: str, tensor: torch.Tensor, path: Path) -> None:
    """Raise ``ModelLoadError`` when a floating ``tensor`` (any shape) holds NaN or Inf.

    Integer tensors pass unchecked (their values cannot be non-finite).
    """
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise ModelLoadError(
            f"{path}: tensor {name} holds {bad} NaN/Inf value(s) out of {tensor.numel()}: the "
            "weights are damaged (re-download the model or check the file)")


def checked(weights: Iterable[tuple[str, torch.Tensor]], path: Path
            ) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` (``(hf_name, tensor)`` pairs), each passed through ``check_finite``."""
    for name, tensor in weights:
        check_finite(name, tensor, path)
        yield name, tensor


# A tokenizer transformers can build: tokenizer.json (no extra packages), tokenizer.model
# (sentencepiece), tiktoken files, or a BPE vocabulary (vocab.json with merges.txt).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer.tiktoken", "vocab.json")


def check_model_folder(path: Path) -> None:
    """Refuse an HF model folder that cannot be loaded, before anything loads, saying what it
    lacks: weights (``*.safetensors``; a pickle checkpoint is named and refused) and a
    tokenizer (``TOKENIZER_FILES``).

    Raises:
        ModelLoadError: one line naming the folder and every missing part.
    """
    names = {p.name for p in Path(path).iterdir()}
    missing = []
    if not any(n.endswith(".safetensors") for n in names):
        pickles = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth")))
        why = f"; {pickles[0]} is a pickle checkpoint, never loaded" if pickles else ""
        missing.append(f"weights (no *.safetensors file{why})")
    if not names & set(TOKENIZER_FILES):
        missing.append("a tokenizer (no tokenizer.json or tokenizer.model)")
    if missing:
        raise ModelLoadError(f"model folder {path} is incomplete: it lacks "
                             + " and ".join(missing))
