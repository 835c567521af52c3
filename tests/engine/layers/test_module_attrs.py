"""``mirror_module_attributes``: every attribute read equals what ``nn.Module.__getattr__``
finds in the module's stores (the independent reference), after each way the engine, its
loaders and PyTorch change those stores."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from localchat.engine.layers.module_attrs import MirroredDict, mirror_module_attributes

_MISSING = object()
NAMES = ("weight", "bias", "qweight", "scales", "cache", "inner", "extra", "plain", "forward")


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3), requires_grad=False)
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        self.bias = None
        self.plain = torch.full((2,), 7.0)  # a plain tensor attribute, not registered


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.layers = nn.ModuleList([Inner(), Inner()])
        self.register_buffer("qweight", torch.arange(4, dtype=torch.uint8))


def reference(module: nn.Module, name: str):
    """What the read means in plain PyTorch: a class attribute, else the instance dict for
    names no store holds, else the store (``nn.Module.__getattr__``)."""
    if hasattr(type(module), name):
        return getattr(type(module), name)
    for store in ("_parameters", "_buffers", "_modules"):
        if name in module.__dict__[store]:
            return module.__dict__[store][name]
    return module.__dict__.get(name, _MISSING)


def check(root: nn.Module) -> None:
    for module in root.modules():
        for name in NAMES:
            got = getattr(module, name, _MISSING)
            want = reference(module, name)
            if name == "forward":  # bound method: compare the function
                assert got.__func__ is want
            else:
                assert got is want, (type(module).__name__, name)


def test_reads_follow_every_store_change():
    m = mirror_module_attributes(Outer())
    assert isinstance(m.inner._parameters, MirroredDict)
    assert "weight" in vars(m.inner)  # the read no longer needs __getattr__
    check(m)
    inner = m.inner
    inner.weight = nn.Parameter(torch.zeros(3), requires_grad=False)  # setattr, parameter
    check(m)
    inner.weight = None
    check(m)
    inner.bias = nn.Parameter(torch.ones(3), requires_grad=False)  # plain None -> parameter
    check(m)
    inner.cache = torch.ones(2)  # setattr of a registered buffer
    check(m)
    del inner._buffers["cache"]  # engine/quant/methods.py _set_buffer
    inner.register_buffer("cache", torch.full((2,), 3.0))
    check(m)
    inner._buffers.pop("cache", None)  # _drop
    check(m)
    assert not hasattr(inner, "cache")
    m._buffers["qweight"] = torch.ones(1)  # loader/quantized.py materialize
    m._parameters["extra"] = nn.Parameter(torch.ones(1), requires_grad=False)
    check(m)
    del m.extra
    check(m)
    m.inner = Inner()  # submodule replaced: its own stores are plain until mirrored again
    check(m)
    mirror_module_attributes(m)
    check(m)
    m.to(torch.float64)  # Module._apply writes the stores
    check(m)
    assert m.inner.weight.dtype == torch.float64 and m.inner.cache.dtype == torch.float64
    m._buffers.update(qweight=torch.zeros(1))
    m._buffers.clear()
    check(m)
    assert not hasattr(m, "qweight")


def test_meta_materialize_and_state_dict():
    with torch.device("meta"):
        m = mirror_module_attributes(Outer())
    m.to_empty(device="cpu")
    check(m)
    assert not m.inner.weight.is_meta and not m.inner.cache.is_meta
    src = Outer()
    m.load_state_dict(src.state_dict())
    check(m)
    assert torch.equal(m.qweight, src.qweight)
    assert set(m.state_dict()) == set(src.state_dict())


def test_class_attribute_names_are_not_shadowed():
    class WithClassAttr(nn.Module):
        scales = "class attribute"

    m = WithClassAttr()
    m._buffers["scales"] = torch.ones(1)  # (register_buffer refuses the name)
    mirror_module_attributes(m)
    check(m)
    assert m.scales == "class attribute" and "scales" not in vars(m)


def test_copies():
    m = mirror_module_attributes(Outer())
    deep = copy.deepcopy(m)
    check(deep)
    deep.inner.weight = nn.Parameter(torch.full((3,), 5.0), requires_grad=False)
    check(deep)
    check(m)
    assert torch.equal(m.inner.weight, torch.ones(3))
    # the spec-decode test's truncated draft: a shallow copy with a fresh _modules
    draft = copy.copy(m)
    draft._modules = dict(m._modules)
    draft.layers = nn.ModuleList(list(m.layers)[:1])
    assert len(draft.layers) == 1 and len(m.layers) == 2
    check(m)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_reads_match_the_stores(arch):
    from localchat.engine.config import ModelConfig
    from localchat.engine.models import get_model_class

    from ..tiny_models import make_config

    config = ModelConfig.from_hf_config(make_config(arch))
    model = get_model_class(config)(config)
    for module in model.modules():
        for name in list(module._parameters) + list(module._buffers) + list(module._modules):
            if name.isidentifier():
                assert name in vars(module)
                assert getattr(module, name) is reference(module, name)
