"""Quantize at load (layer by layer), the quantized-weight cache, and exact weight bytes.

References: the same tiny checkpoint loaded unquantized with its projections replaced by the
dequantized weights (so quantized == float model on the quantized values), the bytes of the
tensors the loaded model actually holds, and the first load's tensors for the cache.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.config import QuantConfig
from localchat.engine.layers.linear import Linear
from localchat.engine.loader import load_model, load_model_config
from localchat.engine.memory.footprint import weight_bytes
from localchat.engine.quant.evaluate import teacher_forced_logits
from localchat.engine.quant.int4 import dequantize_int4, pick_group_size, quantize_int4
from localchat.engine.quant.int4_method import Int4LinearMethod
from localchat.engine.quant.int8 import dequantize_int8, quantize_int8
from localchat.engine.quant.methods import Int8LinearMethod

from ..tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"q-{request.param}")
    save_tiny_model(request.param, folder)
    return folder, load_model_config(folder)


def _load(folder, config, scheme, cache_dir=None, kernel="packed", group_size=32):
    return load_model(folder, config, dtype=torch.float32, device=CPU, max_position=512,
                      cache_dir=cache_dir,
                      quant=QuantConfig(scheme=scheme, group_size=group_size,
                                        use_cache=cache_dir is not None),
                      quant_kernel=kernel)


def _dequantized_reference(folder, config, scheme, group_size=32):
    """The float model with every decoder projection replaced by quantize -> dequantize."""
    model = _load(folder, config, "none")
    for name, m in model.named_modules():
        if isinstance(m, Linear) and name.startswith("model.layers."):
            w = m.weight_t.t()
            if scheme == "int8":
                wq = dequantize_int8(*quantize_int8(w))
            else:
                g = pick_group_size(w.shape[1], group_size)
                wq = dequantize_int4(*quantize_int4(w, g))
            m.weight_t = wq.t().contiguous()
    return model


def _ids(config, n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (n,), generator=g).tolist()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("kernel", ["dequant", "packed"])
def test_quantized_model_equals_float_model_on_dequantized_weights(tiny, scheme, kernel):
    folder, config = tiny
    ids = _ids(config)
    want = teacher_forced_logits(_dequantized_reference(folder, config, scheme), ids)
    got = teacher_forced_logits(_load(folder, config, scheme, kernel=kernel), ids)
    # dequant: fp32 throughout; packed: bf16 activations into the CPU kernels
    tol = 1e-4 if kernel == "dequant" else 3e-2 * want.abs().max().item()
    assert (got - want).abs().max().item() <= tol


@pytest.mark.parametrize("scheme", ["none", "int8", "int4"])
@pytest.mark.parametrize("kernel", ["dequant", "packed"])
def test_weight_bytes_equals_loaded_tensors(tiny, scheme, kernel):
    folder, config = tiny
    model = _load(folder, config, scheme, kernel=kernel)
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    held += sum(m.weight_t.numel() * m.weight_t.element_size() for m in model.modules()
                if getattr(m, "weight_t", None) is not None)
    if kernel == "packed":
        assert weight_bytes(config, scheme, "cpu", torch.float32, group_size=32) == held
    assert weight_bytes(config, "int4", "cpu", torch.float32, 32) < weight_bytes(
        config, "int8", "cpu", torch.float32) < weight_bytes(config, "none", "cpu", torch.float32)


def test_quantizes_layer_by_layer(tiny, monkeypatch):
    """At most one decoder layer's float projections exist at any time while loading."""
    folder, config = tiny
    staged_max = []
    model_ref = {}
    original = Int8LinearMethod.quantize_weights

    def spy(self, layer):
        staged = [n for n, m in model_ref["model"].named_modules()
                  if isinstance(m, Linear) and n.startswith("model.layers.")
                  and m.weight is not None and not m.weight.is_meta]
        staged_max.append(len({n.split(".")[2] for n in staged}))
        original(self, layer)

    from localchat.engine.loader import quantized as qmod

    real_assign = qmod.assign_linear_methods

    def assign(model, *a, **kw):
        model_ref["model"] = model
        return real_assign(model, *a, **kw)

    monkeypatch.setattr(Int8LinearMethod, "quantize_weights", spy)
    monkeypatch.setattr(qmod, "assign_linear_methods", assign)
    _load(folder, config, "int8")
    assert len(staged_max) == 4 * config.num_hidden_layers
    assert max(staged_max) == 1


def test_cache_hit_gives_identical_tensors_without_quantizing(tiny, tmp_path, monkeypatch):
    folder, config = tiny
    first = _load(folder, config, "int4", cache_dir=tmp_path)
    assert not first.quant_cache_hit
    files = list((tmp_path / "quant").glob("*int4-g32-float32.safetensors"))
    assert len(files) == 1

    def boom(self, layer):
        raise AssertionError("re-quantized on a cache hit")

    monkeypatch.setattr(Int4LinearMethod, "quantize_weights", boom)
    monkeypatch.setattr("localchat.engine.loader._iter_weights",
                        lambda *a: pytest.fail("checkpoint read on a cache hit"))
    second = _load(folder, config, "int4", cache_dir=tmp_path)
    assert second.quant_cache_hit
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ids = _ids(config)
    assert torch.equal(teacher_forced_logits(first, ids), teacher_forced_logits(second, ids))


def test_corrupt_cache_is_rebuilt(tiny, tmp_path):
    folder, config = tiny
    first = _load(folder, config, "int8", cache_dir=tmp_path)
    (path,) = (tmp_path / "quant").glob("*.safetensors")
    path.write_bytes(b"not a safetensors file")
    again = _load(folder, config, "int8", cache_dir=tmp_path)
    assert not again.quant_cache_hit
    ids = _ids(config)
    assert torch.equal(teacher_forced_logits(first, ids), teacher_forced_logits(again, ids))
    assert _load(folder, config, "int8", cache_dir=tmp_path).quant_cache_hit


def test_cache_is_keyed_by_scheme_and_group(tiny, tmp_path):
    folder, config = tiny
    _load(folder, config, "int8", cache_dir=tmp_path)
    _load(folder, config, "int4", cache_dir=tmp_path, group_size=32)
    _load(folder, config, "int4", cache_dir=tmp_path, group_size=64)
    names = sorted(p.name.split("-", 2)[-1] for p in (tmp_path / "quant").iterdir())
    assert len(names) == 3


def test_fp8_is_refused_on_cpu(tiny):
    folder, config = tiny
    with pytest.raises(ValueError, match="fp8"):
        _load(folder, config, "fp8")
