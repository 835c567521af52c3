"""``quant.cache.load_quantized_mmap`` into a model on a GPU: every tensor lands in the device
tensor the model allocated, with the bytes that were saved.

On CUDA a cached ``native`` load (every ``ask`` after the first on a GPU) left the tensors as
views of the CPU memory map, and the first step failed ("indices should be either on cpu or
on the same device"). Found by the first H200 run. The reference is the saved state itself:
a small module of int8 / uint8 / fp16 / fp32 buffers and a parameter, saved with
``save_quantized`` from the CPU and loaded into an empty copy on the device. On a CPU the same
test checks the mapped path (tensors mapped, bytes equal).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localchat.engine.quant.cache import NATIVE_FORMAT, load_quantized_mmap, save_quantized

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


class _Layer(nn.Module):
    def __init__(self, device, fill: bool) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        make = (lambda shape, dtype, f: f().to(dtype)) if fill else \
            (lambda shape, dtype, f: torch.empty(shape, dtype=dtype))
        self.register_buffer("qweight", make((64, 32), torch.int8, lambda: torch.randint(
            -128, 128, (64, 32), generator=gen)).to(device))
        self.register_buffer("packed", make((64, 16), torch.uint8, lambda: torch.randint(
            0, 256, (64, 16), generator=gen)).to(device))
        self.register_buffer("scales", make((64, 2), torch.float16, lambda: torch.rand(
            64, 2, generator=gen)).to(device))
        self.norm = nn.Parameter(make((32,), torch.float32, lambda: torch.randn(
            32, generator=gen)).to(device), requires_grad=False)


@pytest.mark.parametrize("device", DEVICES)
def test_a_cached_load_fills_the_models_own_device(device, tmp_path):
    saved = nn.Sequential(_Layer("cpu", fill=True))
    path = tmp_path / "cache.safetensors"
    save_quantized(saved, path, {"format": NATIVE_FORMAT})
    model = nn.Sequential(_Layer(device, fill=False))
    assert load_quantized_mmap(model, path, fmt=NATIVE_FORMAT)
    got, want = model.state_dict(), saved.state_dict()
    assert set(got) == set(want)
    for name, tensor in got.items():
        assert tensor.device.type == device, name
        assert torch.equal(tensor.cpu(), want[name]), name
    assert isinstance(model[0].norm, nn.Parameter)
