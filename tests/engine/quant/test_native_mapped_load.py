"""A cached ``native`` load maps the cache file for every layer that computes over its tensors
as loaded: with localchat's C++ kernels built, SmolLM2's Q4_1 (int4) projections too, not
only the int8 embedding. Only layers that PyTorch's int4pack kernel repacks at load
(``Int4LinearMethod.replaces_weights_on_load``) are read into memory instead.

Checked on the real SmolLM2 GGUF: the mapped tensors lie inside a mapping of the cache file
(``/proc/self/maps``), hold the same bits as a load that reads every layer, and give the
same logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localchat.engine.config import QuantConfig
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.quant.cache import NATIVE_FORMAT, cache_path
from localchat.engine.quant.evaluate import teacher_forced_logits
from localchat.engine.quant.native import NativeInt4LinearMethod
from localchat.kernels import cpu


def _load(path: Path, cache: Path):
    return load_model(path, load_model_config(path, cache), dtype=torch.float32,
                      device=torch.device("cpu"), max_position=256, cache_dir=cache,
                      quant=QuantConfig(scheme="native"))


def _file_ranges(file: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``file``."""
    target = str(file.resolve())
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def _mapped(t: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    start = t.data_ptr()
    return any(lo <= start and start + t.nbytes <= hi for lo, hi in ranges)


def _int4_layers(model) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), NativeInt4LinearMethod)
            and getattr(m, "qweight", None) is not None and m.quant_method.kernel == "packed"}


def test_cached_load_maps_layers_the_kernels_read_in_place(smollm2_gguf, tmp_path,
                                                           monkeypatch):
    if not cpu.available():
        pytest.skip("CPU kernels not built: int4 layers are repacked for PyTorch's kernel")
    first = _load(smollm2_gguf, tmp_path)  # repacks from the GGUF and writes the cache entry
    assert not first.quant_cache_hit
    entry = cache_path(tmp_path, smollm2_gguf, "native", 32, torch.float32, NATIVE_FORMAT)
    assert entry.is_file()

    mapped = _load(smollm2_gguf, tmp_path)
    assert mapped.quant_cache_hit
    layers = _int4_layers(mapped)
    assert len(layers) == 30 * 4  # qkv, o, gate_up, down: every Q4_1 projection, fused
    ranges = _file_ranges(entry)
    assert ranges, "the cache file is not mapped"
    for name, layer in layers.items():
        assert not layer.quant_method.replaces_weights_on_load(), name
        for attr in ("qweight", "scales", "mins"):
            assert _mapped(getattr(layer, attr), ranges), f"{name}.{attr} was copied"

    # the old path: every int4 layer read into its own memory
    monkeypatch.setattr(NativeInt4LinearMethod, "replaces_weights_on_load", lambda self: True)
    read = _load(smollm2_gguf, tmp_path)
    assert read.quant_cache_hit
    ranges = _file_ranges(entry)
    for name, layer in _int4_layers(read).items():
        assert not _mapped(layer.qweight, ranges), name
    monkeypatch.undo()

    a, b, c = first.state_dict(), mapped.state_dict(), read.state_dict()
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        bits = [t.reshape(-1).view(torch.uint8) if t.dim() else t for t in (a[name], b[name],
                                                                             c[name])]
        assert torch.equal(bits[0], bits[1]) and torch.equal(bits[1], bits[2]), name
    ids = [1, 504, 3458, 282, 4649, 314, 3575, 30, 2]  # a short text's worth of ids
    assert torch.equal(teacher_forced_logits(mapped, ids), teacher_forced_logits(read, ids))
