"""A native Q5_0 layer in the int5 panel layout (``engine/quant/int5_panel.py``) against the
same layer in the row layout, built from random Q5_0 blocks through the loader's row placement.

- After ``to_panel`` the layer holds the same bytes (``from_panel5`` gives the row layout back
  exactly) and ``weight_bytes``; up to 16 rows ``apply`` equals the panel op and stays within
  ``test_int5``'s bound of the integer-dot reference on the row layout, batch invariant
  through the layer; ``decode_plan`` (the C++ decoder stack's call) gives the same bits.
- In an fp32 engine (``kernels.a8_fp32``) decode rows take the integer-dot op; its prompt rows
  the exact fp32 op (``int5_panel_f32``), a 24-row prompt as chunks of it; a bf16 / fp16
  prompt of 40 rows equals the row-layout layer bit for bit (both dequantize the same values
  for the GEMM).
- Rows read back (``dequantize_rows``, ``embed``) equal the row layout's reference
  dequantization bit for bit.
- ``adopt_panel`` takes Q5_0 layers the panel can tile, the output layer included, not a pure
  embedding, and names the entry with ``-q5``; by default at the AVX2 level, not where VNNI
  runs; forced below AVX2 it warns once. Q5_0 held as int8 names its own entry (``-q5i8``).
  The quantized cache restores the panel by buffer name, and ``to_rows`` gives back fillable
  row buffers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localchat import kernels
from localchat.engine.quant import int4_panel, int5_panel
from localchat.engine.quant.int4_panel import PANEL_ENV, adopt_panel, panel_scheme
from localchat.engine.quant.int5_panel import PanelInt5LinearMethod, from_panel5
from localchat.engine.quant.native_int5 import Int5LinearMethod
from localchat.engine.quant.native_int6 import Int6LinearMethod
from localchat.kernels import cpu, reference
from tests.engine.quant.test_panel_layer import check_cache_round_trip, native_layer, panel_layer
from tests.kernels.batch_invariance import assert_batch_invariant
from tests.kernels.test_int5 import activations, assert_a8_close

Q5_0, Q6_K = 6, 14
N, K = 48, 896


@pytest.fixture(autouse=True)
def _kernels():
    if not cpu.available():
        pytest.skip("no C++ compiler: the panel layout is chosen only where its kernel is built")


def _layer(method, n=N, k=K, seed=3, ggml_type=Q5_0):
    return native_layer(method, n, k, ggml_type, seed)


def _panel_layer(seed=3):
    layer, rows = panel_layer(PanelInt5LinearMethod("cpu"), int5_panel._ROW_NAMES, N, K, Q5_0,
                              seed)
    return layer, tuple(rows.values())


def test_panel_layer_holds_the_row_bytes_and_computes_the_panel_op():
    layer, rows = _panel_layer()
    assert not any(name in layer._buffers for name in int5_panel._ROW_NAMES)
    panel = [layer._buffers[name] for name in int5_panel._PANEL_NAMES]
    for got, want in zip(from_panel5(*panel), rows):
        assert torch.equal(got, want)
    held = sum(t.nbytes for t in layer.buffers())
    assert held == sum(t.nbytes for t in rows)
    assert held == layer.quant_method.weight_bytes(N, K, torch.bfloat16)
    for m_rows in (1, 5, 16):
        x = activations(m_rows, K, seed=m_rows).bfloat16()
        y = layer(x)
        assert torch.equal(y, cpu.int5_panel_a8(x, *panel))
        assert_a8_close(cpu.int5_panel_a8(x.float(), *panel), x.float(), rows)
    assert_batch_invariant(layer, activations(16, K, seed=1).bfloat16())
    (name, args), = layer.quant_method.decode_plan(layer, torch.bfloat16)[0]
    x = activations(3, K, seed=2).bfloat16()
    call = getattr(torch.ops.localchat_cpu, name)
    assert torch.equal(call(*[x if a is kernels.INPUT else a for a in args]), layer(x))


def test_fp32_engine_rows_and_16_bit_prompts():
    layer, rows = _panel_layer(seed=7)
    row_layer = _layer(Int5LinearMethod("cpu"), seed=7)
    panel = [layer._buffers[name] for name in int5_panel._PANEL_NAMES]
    x = activations(5, K, seed=1)
    with kernels.a8_fp32():  # an fp32 engine's decode step: the integer-dot op
        y = layer(x)
    assert torch.equal(y, cpu.int5_panel_a8(x, *panel))
    assert_a8_close(y, x, rows)
    # its prompt step: the exact fp32 op over the dequantized values (a prompt's KV does not
    # depend on its chunking); a 24-row prompt (the planar layouts' short-prefill limit) as
    # chunks of it, each row its one-row call
    exact = x @ reference.dequantize_int5(*rows).T
    y = layer(x)
    assert not torch.equal(y, cpu.int5_panel_a8(x, *panel))
    assert torch.equal(y, cpu.int5_panel_f32(x, *panel))
    torch.testing.assert_close(y, exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())
    x24 = activations(24, K, seed=3)
    assert layer.quant_method.exact_cpu_rows(layer)
    assert layer.quant_method.short_prefill_rows(layer) == 24
    assert torch.equal(layer(x24), torch.cat([cpu.int5_panel_f32(r, *panel) for r in x24.split(1)]))
    (name, args), = layer.quant_method.decode_plan(layer, torch.float32)[0]
    assert name == "int5_panel_f32"
    for dtype in (torch.bfloat16, torch.float16):  # a prompt: the row layout's GEMM, bit for bit
        x = activations(40, K, seed=2).to(dtype)
        assert torch.equal(layer(x), row_layer(x))


def test_rows_read_back_equal_the_row_layout():
    layer, rows = _panel_layer(seed=4)
    want = reference.dequantize_int5(*rows)
    method = layer.quant_method
    assert torch.equal(method.dequantize_rows(layer, slice(5, 37)), want[5:37])
    ids = torch.tensor([47, 3, 3, 16, 0, 31])
    assert torch.equal(method.dequantize_rows(layer, ids), want[ids])
    got = method.embed(layer, ids, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want[ids].bfloat16())


def _model():
    model = nn.Module()
    model.model = nn.Module()
    model.model.embed_tokens = _layer(Int5LinearMethod("cpu"))  # a pure embedding
    model.q5 = _layer(Int5LinearMethod("cpu"))
    model.q6k = _layer(Int6LinearMethod("cpu"), k=768, ggml_type=Q6_K)
    model.odd = _layer(Int5LinearMethod("cpu"), n=40)
    model.head = _layer(Int5LinearMethod("cpu"))
    return model


@pytest.mark.parametrize("env", ["", "0", "1"])
def test_adopt_panel_takes_q5_0_linears_and_the_head(monkeypatch, env):
    monkeypatch.setenv(PANEL_ENV, env)
    kinds = {"": int4_panel.fast_kinds(), "0": frozenset(), "1": int4_panel.KINDS}[env]
    model = _model()
    adopted = adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    taken = "int5" in kinds
    assert adopted == ([model.q5] if taken else []) + (
        [model.q6k] if "int6" in kinds else []) + ([model.head] if taken else [])
    for layer in (model.q5, model.head):
        assert isinstance(layer.quant_method, PanelInt5LinearMethod) == taken
    assert type(model.model.embed_tokens.quant_method) is Int5LinearMethod
    assert type(model.odd.quant_method) is Int5LinearMethod
    if taken:  # its own cache entry: with or without the int5 panel never share one
        assert panel_scheme(adopted) == "native-panel-q6-q5"
        assert panel_scheme([model.q5]) == "native-panel-q5"


def test_int5_is_left_out_by_default_only_where_vnni_runs(monkeypatch):
    """The int5 panel has an AVX2 kernel only: taken by default at the AVX2 level (a model's
    Q5_0 layers and head adopted, capped to AVX2 on any CPU that has it), not where the row
    layout's VNNI kernel runs (AVX-512 VNNI active)."""
    if cpu.amx_enabled():
        pytest.skip("AMX CPUs keep the row layouts (their prefill GEMM reads them)")
    if cpu.best_isa() < 1:
        pytest.skip("no AVX2: no panel is taken by default")
    monkeypatch.setenv(PANEL_ENV, "")
    monkeypatch.setenv("LOCALCHAT_CPU_ISA", "avx2")  # re-read at once (tests/conftest.py)
    model = _model()
    adopted = adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    assert adopted == [model.q5, model.q6k, model.head]
    assert panel_scheme(adopted) == "native-panel-q6-q5"
    monkeypatch.setenv("LOCALCHAT_CPU_ISA", "")
    model = _model()
    taken = adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    if cpu.active_isa() >= 2 and cpu.has_vnni():
        assert taken == [model.q6k] and type(model.q5.quant_method) is Int5LinearMethod
    else:
        assert taken == [model.q5, model.q6k, model.head]
        assert isinstance(model.q5.quant_method, PanelInt5LinearMethod)


def test_forced_panel_below_avx2_says_it_is_slow(monkeypatch, caplog):
    """``LOCALCHAT_CPU_PANEL=1`` with the ISA capped to scalar takes the int5 panel's portable
    kernel: one warning line naming int5 among the slow kinds."""
    import logging

    monkeypatch.setenv(PANEL_ENV, "1")
    monkeypatch.setenv("LOCALCHAT_CPU_ISA", "scalar")  # re-read at once (tests/conftest.py)
    model = _model()
    with caplog.at_level(logging.WARNING, logger="localchat.engine.quant.int4_panel"):
        assert model.q5 in adopt_panel(model, "cpu", torch.bfloat16, head=model.head)
    said = [r.getMessage() for r in caplog.records if "portable code" in r.getMessage()]
    assert len(said) == 1 and "int5" in said[0]


def test_q5_0_held_as_int8_names_its_own_cache_entry(monkeypatch):
    """Q5_0 held as int8 (``LOCALCHAT_CPU_INT5=0``) and as int5 are two cache entries (the
    ``-q5i8`` suffix; a switch back and forth rebuilt one entry each time before); a file
    without Q5_0 gets no suffix either way."""
    from localchat.engine.loader.native import _q5_suffix

    q5 = {"layer": [(0, ("int5", 32, False, torch.float16)), (1, ("int8", 32, False,
                                                                   torch.float16))]}
    q8 = {"layer": [(0, ("int8", 32, False, torch.float16))]}
    monkeypatch.delenv("LOCALCHAT_CPU_INT5", raising=False)
    assert _q5_suffix(q5, torch.device("cpu"), "packed") == ""
    assert _q5_suffix(q5, torch.device("cpu"), "int4pack") == "-q5i8"
    monkeypatch.setenv("LOCALCHAT_CPU_INT5", "0")  # read at each load
    assert _q5_suffix(q5, torch.device("cpu"), "packed") == "-q5i8"
    assert _q5_suffix(q8, torch.device("cpu"), "packed") == ""


def test_cache_round_trip_and_back_to_rows(tmp_path):
    model = nn.Module()
    model.w, _ = _panel_layer(seed=5)
    check_cache_round_trip(tmp_path, model, _layer(PanelInt5LinearMethod("cpu"), seed=6), Q5_0,
                           int5_panel._ROW_NAMES, int5_panel._PANEL_NAMES,
                           activations(3, K, seed=4).bfloat16())
