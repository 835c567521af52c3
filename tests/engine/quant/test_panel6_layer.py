"""A native Q6_K layer in the int6 panel layout (``engine/quant/int6_panel.py``) against the
same layer in the row layout, built from random Q6_K blocks through the loader's row placement.

- After ``to_panel`` the layer holds the same bytes (``from_panel6`` gives the row layout back
  exactly) and ``weight_bytes``; ``apply`` equals the panel op for any row count, stays within
  ``test_int6``'s bound of the integer-dot reference on the row layout, and is batch invariant
  through the layer; ``decode_plan`` (the C++ decoder stack's call) gives the same bits.
- Rows read back (``dequantize_rows`` for the greedy head, ``embed`` for a tied embedding)
  equal the row layout's reference dequantization bit for bit, for a slice and for unsorted,
  repeated ids.
- ``adopt_panel`` takes Q6_K layers the panel can tile, the output layer included, not a pure
  embedding, and names the entry ``native-panel-q6``; the quantized cache restores the panel
  by buffer name, and ``to_rows`` gives back fillable row buffers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localchat import kernels
from localchat.engine.quant import int4_panel, int6_panel
from localchat.engine.quant.int4_panel import PANEL_ENV, adopt_panel, panel_scheme
from localchat.engine.quant.int6_panel import PanelInt6LinearMethod, from_panel6
from localchat.engine.quant.native import NativeInt4LinearMethod
from localchat.engine.quant.native_int6 import Int6LinearMethod
from localchat.kernels import cpu, reference
from tests.engine.quant.test_panel_layer import check_cache_round_trip, native_layer, panel_layer
from tests.kernels.batch_invariance import assert_batch_invariant
from tests.kernels.test_int6 import activations, assert_a8_close

Q4_K, Q6_K = 12, 14
N, K = 48, 768


@pytest.fixture(autouse=True)
def _kernels():
    if not cpu.available():
        pytest.skip("no C++ compiler: the panel layout is chosen only where its kernel is built")


def _layer(method, n=N, k=K, seed=3, ggml_type=Q6_K):
    return native_layer(method, n, k, ggml_type, seed)


def _panel_layer(seed=3):
    layer, rows = panel_layer(PanelInt6LinearMethod("cpu"), int6_panel._ROW_NAMES, N, K, Q6_K, seed)
    return layer, tuple(rows.values())


def test_panel_layer_holds_the_row_bytes_and_computes_the_panel_op():
    layer, rows = _panel_layer()
    assert not any(name in layer._buffers for name in int6_panel._ROW_NAMES)
    panel = [layer._buffers[name] for name in int6_panel._PANEL_NAMES]
    for got, want in zip(from_panel6(*panel), rows):
        assert torch.equal(got, want)
    held = sum(t.nbytes for t in layer.buffers())
    assert held == sum(t.nbytes for t in rows)
    assert held == layer.quant_method.weight_bytes(N, K, torch.bfloat16)
    for m_rows in (1, 5, 16, 40):
        x = activations(m_rows, K, seed=m_rows)
        y = layer(x)
        assert torch.equal(y, cpu.int6_panel_a8(x, *panel))
        assert_a8_close(y, x, rows)
    assert_batch_invariant(layer, activations(20, K, seed=1).bfloat16())
    (name, args), = layer.quant_method.decode_plan(layer, torch.bfloat16)[0]
    x = activations(3, K, seed=2).bfloat16()
    call = getattr(torch.ops.localchat_cpu, name)
    assert torch.equal(call(*[x if a is kernels.INPUT else a for a in args]), layer(x))


def test_rows_read_back_equal_the_row_layout():
    layer, rows = _panel_layer(seed=4)
    want = reference.dequantize_int6(*rows)
    method = layer.quant_method
    assert torch.equal(method.dequantize_rows(layer, slice(5, 37)), want[5:37])
    ids = torch.tensor([47, 3, 3, 16, 0, 31])
    assert torch.equal(method.dequantize_rows(layer, ids), want[ids])
    got = method.embed(layer, ids, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want[ids].bfloat16())


def _model():
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = _layer(Int6LinearMethod("cpu"))  # a pure embedding
    model.q4k = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.uint8), ggml_type=Q4_K)
    model.q6k = _layer(Int6LinearMethod("cpu"))
    model.odd = _layer(Int6LinearMethod("cpu"), n=40)
    model.head = _layer(Int6LinearMethod("cpu"))
    return model


@pytest.mark.parametrize("env", ["", "0"])
def test_adopt_panel_takes_q6k_linears_and_the_head(monkeypatch, env):
    monkeypatch.setenv(PANEL_ENV, env)
    kinds = int4_panel.fast_kinds() if env == "" else frozenset()
    taken = "int6" in kinds
    model = _model()
    adopted = adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    assert adopted == ([model.q4k] if "int4" in kinds else []) + (
        [model.q6k, model.head] if taken else [])
    for layer in (model.q6k, model.head):
        assert isinstance(layer.quant_method, PanelInt6LinearMethod) == taken
    assert type(model.model.embed_tokens.quant_method) is Int6LinearMethod
    assert type(model.odd.quant_method) is Int6LinearMethod
    assert panel_scheme(adopted) == ("native-panel-q6" if taken else
                                     "native-panel" if adopted else "native")
    if taken:  # a model without Q6_K layers keeps the Q4_K panel's entry
        assert panel_scheme([model.q4k]) == "native-panel"


def test_tied_head_embedding_is_taken(monkeypatch):
    monkeypatch.setenv(PANEL_ENV, "1")
    model = _model()
    tied = model.model.embed_tokens
    assert tied in adopt_panel(model, "cpu", torch.bfloat16, head=tied)
    assert isinstance(tied.quant_method, PanelInt6LinearMethod)


def test_cache_round_trip_and_back_to_rows(tmp_path):
    model = nn.Module()
    model.w, _ = _panel_layer(seed=5)
    check_cache_round_trip(tmp_path, model, _layer(PanelInt6LinearMethod("cpu"), seed=6), Q6_K,
                           int6_panel._ROW_NAMES, int6_panel._PANEL_NAMES,
                           activations(3, K, seed=4).bfloat16())
