"""A native Q8_0 layer in the int8 panel layout (``engine/quant/int8_panel.py``) against the
same layer in the row layout, built from random Q8_0 blocks through the loader's row placement.

- After ``to_panel`` the layer holds the same bytes (``from_panel8`` gives the row layout back
  exactly) and ``weight_bytes``; up to 16 rows ``apply`` equals the panel op, stays within
  the summation bound of the integer-dot reference on the row layout, and is batch invariant
  through the layer; fp32 rows of a prompt step take the exact fp32 op (``int8_panel_f32``,
  each row its one-row call, within the fp32 summation bound of the float64 product);
  ``decode_plan`` (the C++ decoder stack's call) gives the same bits; a
  longer prompt equals the row layout's layer bit for bit (the same dequantized values in the
  same GEMM); ``apply_prefix`` (a draft's vocabulary) equals the first outputs bit for bit.
- Rows read back (``dequantize_rows`` for the greedy head, ``embed`` for a tied embedding)
  equal the row layout's bit for bit, for a slice and for unsorted, repeated ids.
- ``adopt_panel`` takes Q8_0 layers the panel can tile, the output layer (and a tied
  embedding that is it) included, not a pure embedding nor other int8 forms (groups of 16,
  mins, fp32 scales), and names the entry ``...-q8``; the quantized cache restores the panel
  by buffer name, and ``to_rows`` gives back fillable row buffers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant import int4_panel, int8_panel
from localchat.engine.quant.int4_panel import PANEL_ENV, adopt_panel, panel_scheme
from localchat.engine.quant.int8_panel import PanelInt8LinearMethod, from_panel8
from localchat.engine.quant.native import Int8GroupLinearMethod
from localchat.kernels import cpu
from tests.engine.quant.test_panel_layer import check_cache_round_trip, native_layer, panel_layer
from tests.kernels.batch_invariance import assert_batch_invariant
from tests.kernels.test_cpu_quant_a8 import activations, assert_summation_close

Q8_0 = 8
N, K = 48, 576


@pytest.fixture(autouse=True)
def _kernels():
    if not cpu.available():
        pytest.skip("no C++ compiler: the panel layout is chosen only where its kernel is built")


def _row_method():
    return Int8GroupLinearMethod("cpu", 32, False, "packed", torch.float16)


def _layer(method, n=N, k=K, seed=3, ggml_type=Q8_0):
    return native_layer(method, n, k, ggml_type, seed)


def _panel_layer(seed=3):
    layer, rows = panel_layer(PanelInt8LinearMethod("cpu"), int8_panel._ROW_NAMES, N, K, Q8_0, seed)
    return layer, tuple(rows.values())


def test_panel_layer_holds_the_row_bytes_and_computes_the_panel_op():
    layer, rows = _panel_layer()
    row_layer = _layer(_row_method())
    assert not any(name in layer._buffers for name in int8_panel._ROW_NAMES)
    panel = [layer._buffers[name] for name in int8_panel._PANEL_NAMES]
    for got, want in zip(from_panel8(*panel), rows):
        assert torch.equal(got, want)
    held = sum(t.nbytes for t in layer.buffers())
    assert held == sum(t.nbytes for t in rows)
    assert held == layer.quant_method.weight_bytes(N, K, torch.bfloat16)
    for m_rows in (1, 5, 16):
        x = activations(m_rows, K, seed=m_rows)
        with kernels.a8_fp32():  # fp32 rows outside it take the exact fp32 op (below)
            y = layer(x)
        assert torch.equal(y, cpu.int8_panel_a8(x, *panel))
        assert_summation_close(y, x, rows[0], rows[1].float(), None, 32)
    assert_batch_invariant(layer, activations(16, K, seed=1).bfloat16())
    # an fp32 engine's prompt step: the exact fp32 op, each row its one-row call (a 40-row
    # short prefill as 16-row chunks), within the fp32 summation bound of the float64 product
    x = activations(40, K, seed=6)
    y = layer(x)
    assert torch.equal(y, torch.cat([cpu.int8_panel_f32(r, *panel) for r in x.split(1)]))
    w = rows[0].double() * rows[1].double().repeat_interleave(32, 1)
    bound = (K + 1) * 2.0 ** -24 * (x.double().abs() @ w.abs().T)
    assert bool(((y.double() - x.double() @ w.T).abs() <= bound).all())
    (name, args), = layer.quant_method.decode_plan(layer, torch.bfloat16)[0]
    x = activations(3, K, seed=2).bfloat16()
    call = getattr(torch.ops.localchat_cpu, name)
    assert torch.equal(call(*[x if a is kernels.INPUT else a for a in args]), layer(x))
    for dtype in (torch.bfloat16, torch.float16):  # a prompt: the row layout's GEMM, bit for bit
        x = activations(40, K, seed=2).to(dtype)
        assert torch.equal(layer(x), row_layer(x))
    x = activations(3, K, seed=5).bfloat16()  # a draft's vocabulary: the first tiles alone
    method = layer.quant_method
    assert torch.equal(method.apply_prefix(layer, x, 32), layer(x)[:, :32])
    assert torch.equal(method.apply_prefix(layer, x, 40), layer(x)[:, :40])  # not whole tiles


def test_rows_read_back_equal_the_row_layout():
    layer, _ = _panel_layer(seed=4)
    row_layer = _layer(_row_method(), seed=4)
    method, row = layer.quant_method, row_layer.quant_method
    assert torch.equal(method.dequantize_rows(layer, slice(5, 37)),
                       row.dequantize_rows(row_layer, slice(5, 37)))
    ids = torch.tensor([47, 3, 3, 16, 0, 31])
    assert torch.equal(method.dequantize_rows(layer, ids), row.dequantize_rows(row_layer, ids))
    got = method.embed(layer, ids, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, row.embed(row_layer, ids, torch.bfloat16))


def _model():
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = _layer(_row_method())  # a pure embedding
    model.q8 = _layer(_row_method())
    model.odd = _layer(_row_method(), n=40)
    for name, method in (("g16", Int8GroupLinearMethod("cpu", 16, False, "packed",
                                                        torch.float16)),
                         ("mins", Int8GroupLinearMethod("cpu", 32, True, "packed",
                                                        torch.float16)),
                         ("fp32", Int8GroupLinearMethod("cpu", 32, False, "packed"))):
        layer = Linear(K, N)  # (never filled: adopt_panel reads the method and the shape)
        layer.quant_method = method
        method.create_weights(layer, "cpu")
        setattr(model, name, layer)
    model.head = _layer(_row_method())
    return model


@pytest.mark.parametrize("env", ["", "0"])
def test_adopt_panel_takes_q8_linears_and_the_head(monkeypatch, env):
    monkeypatch.setenv(PANEL_ENV, env)
    taken = env == "" and "int8" in int4_panel.fast_kinds()
    model = _model()
    adopted = adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    assert adopted == ([model.q8, model.head] if taken else [])
    for layer in (model.q8, model.head):
        assert isinstance(layer.quant_method, PanelInt8LinearMethod) == taken
    for other in (model.model.embed_tokens, model.odd, model.g16, model.mins, model.fp32):
        assert type(other.quant_method) is Int8GroupLinearMethod
    assert panel_scheme(adopted) == ("native-panel-q8" if taken else "native")


def test_tied_head_embedding_is_taken(monkeypatch):
    monkeypatch.setenv(PANEL_ENV, "1")
    model = _model()
    tied = model.model.embed_tokens
    assert tied in adopt_panel(model, "cpu", torch.bfloat16, head=tied)
    assert isinstance(tied.quant_method, PanelInt8LinearMethod)


def test_cache_round_trip_and_back_to_rows(tmp_path):
    model = nn.Module()
    model.w, _ = _panel_layer(seed=5)
    check_cache_round_trip(tmp_path, model, _layer(PanelInt8LinearMethod("cpu"), seed=6), Q8_0,
                           int8_panel._ROW_NAMES, int8_panel._PANEL_NAMES,
                           activations(3, K, seed=4).bfloat16())
