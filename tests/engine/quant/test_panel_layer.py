"""A native Q4_K layer in the panel layout (``engine/quant/int4_panel.py``) against the same
layer in the row layout, built from random Q4_K blocks through the loader's row placement.

- After ``to_panel`` the layer holds the same bytes (the row layout is recovered exactly by
  ``from_panel``) and ``weight_bytes``; ``apply`` equals the panel op, for any row count, and
  stays within the integer-dot reference's summation bound of the row layer's reference
  (``tests/kernels/test_cpu_quant_a8.py``); it is batch invariant through the layer.
- ``decode_plan`` (the C++ decoder stack's call) gives the same bits as ``apply``.
- A Q4_1 layer (fp16 scales, one level; SmolLM2's K = 576) in the panel computes its op up to
  16 rows inside an fp32 engine's decode step, its exact fp32 op (``int4_panel_f32``) in a
  prompt step (a 40-row short prefill as 16-row chunks of it; the decoder stack's plan the
  same call), and a bf16 / fp16 prompt equals the same layer in the row layout bit for bit
  (both dequantize the same values for the GEMM).
- ``adopt_panel`` takes native Q4_K, Q4_0 and Q4_1 linear layers only: not the embedding, not
  the output layer, not a shape the panel cannot tile, not with ``LOCALCHAT_CPU_PANEL=0`` or
  fp32 activations; ``=1`` forces it wherever the kernels are built.
- Each choice names its own cache entry (``panel_scheme``).
- The quantized cache restores a panel layer by buffer name into empty panel tensors, and
  ``to_rows`` gives back fillable row buffers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from localchat import kernels
from localchat.engine.layers.linear import Linear
from localchat.engine.quant import int4_panel
from localchat.engine.quant.int4_panel import (
    PanelInt4LinearMethod,
    adopt_panel,
    from_panel,
    panel_scheme,
)
from localchat.engine.quant.native import NativeInt4LinearMethod, repack_into_rows
from localchat.kernels import cpu, reference
from tests.engine.quant.test_gguf_repack import _random_blocks
from tests.kernels.batch_invariance import assert_batch_invariant
from tests.kernels.test_cpu_quant_a8 import activations, assert_summation_close

Q4_1, Q4_K = 3, 12
N, K = 48, 768


@pytest.fixture(autouse=True)
def _kernels():
    if not cpu.available():
        pytest.skip("no C++ compiler: the panel layout is chosen only where its kernel is built")


def native_layer(method, n: int, k: int, ggml_type: int, seed: int = 3) -> Linear:
    """A ``Linear(k, n)`` under ``method`` (row layout), its rows filled from random GGUF
    blocks of ``ggml_type`` through the loader's row placement. Shared by the int6 and int8
    panel layers' tests."""
    layer = Linear(k, n)
    layer.quant_method = method
    method.create_weights(layer, "cpu")
    assert repack_into_rows(layer, _random_blocks(ggml_type, n, k, seed=seed), ggml_type,
                            (n, k), 0, n)
    return layer


def panel_layer(method, row_names, n: int, k: int, ggml_type: int, seed: int = 3):
    """:func:`native_layer` converted to ``method``'s panel layout, and a copy of its row
    buffers ``row_names`` taken before: ``(layer, {name: tensor})``."""
    layer = native_layer(method, n, k, ggml_type, seed)
    rows = {name: layer._buffers[name].clone() for name in row_names}
    layer.quant_method.to_panel(layer)
    return layer, rows


def _layer(method, n=N, k=K, seed=3, ggml_type=Q4_K):
    return native_layer(method, n, k, ggml_type, seed)


def _panel_layer(seed=3):
    return panel_layer(PanelInt4LinearMethod("cpu"), int4_panel._ROW_NAMES, N, K, Q4_K, seed)


def test_panel_layer_holds_the_row_bytes_and_computes_the_panel_op():
    layer, rows = _panel_layer()
    assert not any(name in layer._buffers for name in int4_panel._ROW_NAMES)
    panel = [layer._buffers[name] for name in int4_panel._PANEL_NAMES]
    for got, want in zip(from_panel(*panel), rows.values()):
        assert torch.equal(got, want)
    held = sum(t.nbytes for t in layer.buffers())
    assert held == sum(t.nbytes for t in rows.values())
    assert held == layer.quant_method.weight_bytes(N, K, torch.bfloat16)
    s, m = reference.fold_kscales(rows["scales"], rows["mins"], rows["super_scales"])
    for m_rows in (1, 5, 16, 40):
        x = activations(m_rows, K, seed=m_rows)
        y = layer(x)
        assert torch.equal(y, cpu.int4_panel_a8(x, *panel))
        assert_summation_close(y, x, reference.unpack_int4(rows["qweight"]), s, m, 32)
    assert_batch_invariant(layer, activations(20, K, seed=1).bfloat16())


def test_q4_1_layer_in_panel_equals_its_op():
    layer = _layer(PanelInt4LinearMethod("cpu", torch.float16), n=32, k=576, ggml_type=Q4_1)
    row_layer = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.float16), n=32, k=576,
                       ggml_type=Q4_1)
    rows = [layer._buffers[name].clone() for name in ("qweight", "scales", "mins")]
    layer.quant_method.to_panel(layer)
    assert "psuper" not in layer._buffers and "pscales" in layer._buffers
    panel = [layer._buffers[name] for name in ("qpanel", "pscales", "pmins")]
    for got, want in zip(from_panel(*panel), rows):
        assert torch.equal(got, want)
    x = activations(5, 576, seed=1)
    with kernels.a8_fp32():  # an fp32 engine's decode step: the integer-dot op
        y = layer(x)
    assert torch.equal(y, cpu.int4_panel_a8(x, *panel))
    assert_summation_close(y, x, reference.unpack_int4(rows[0]), rows[1].float(),
                           rows[2].float(), 32)
    # its prompt step (fp32 rows outside a8_fp32): the exact fp32 op over the dequantized
    # values, so a prompt's KV does not depend on its chunking; a short prefill (40 rows) as
    # 16-row chunks of it, each row equal to its one-row call; the decoder stack's plan too
    exact = x @ reference.dequantize_int4(rows[0], rows[1], rows[2], 32).T
    y = layer(x)
    assert not torch.equal(y, cpu.int4_panel_a8(x, *panel))
    assert torch.equal(y, cpu.int4_panel_f32(x, *panel))
    torch.testing.assert_close(y, exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())
    x40 = activations(40, 576, seed=3)
    assert layer.quant_method.exact_cpu_rows(layer)
    assert torch.equal(layer(x40), torch.cat([cpu.int4_panel_f32(r, *panel) for r in x40.split(1)]))
    (name, args), = layer.quant_method.decode_plan(layer, torch.float32)[0]
    assert name == "int4_panel_f32"
    call = getattr(torch.ops.localchat_cpu, name)
    assert torch.equal(call(*[x if a is kernels.INPUT else a for a in args]), y)
    for dtype in (torch.bfloat16, torch.float16):  # a prompt: the row layout's GEMM, bit for bit
        x = activations(40, 576, seed=2).to(dtype)
        assert torch.equal(layer(x), row_layer(x))


def test_decode_plan_is_apply():
    layer, _ = _panel_layer()
    (name, args), = layer.quant_method.decode_plan(layer, torch.bfloat16)[0]
    x = activations(3, K, seed=2).bfloat16()
    call = getattr(torch.ops.localchat_cpu, name)
    assert torch.equal(call(*[x if a is kernels.INPUT else a for a in args]), layer(x))


def _model(head_n=N, odd_n=40):
    model = nn.Module()
    model.embed = _layer(NativeInt4LinearMethod("cpu", keep_rows=True,
                                                scale_dtype=torch.uint8))
    model.q4k = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.uint8))
    model.odd = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.uint8), n=odd_n)
    model.q41 = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.float16),
                       ggml_type=Q4_1)
    model.head = _layer(NativeInt4LinearMethod("cpu", scale_dtype=torch.uint8), n=head_n)
    return model


@pytest.mark.parametrize("env,dtype,taken", [
    ("", torch.bfloat16, "vnni"), ("0", torch.bfloat16, False), ("1", torch.bfloat16, True),
    ("1", torch.float32, False), ("", torch.float16, "vnni"), ("Off", torch.bfloat16, False),
    ("yes", torch.bfloat16, True)])
def test_adopt_panel_takes_native_q4k_linears_only(monkeypatch, env, dtype, taken):
    monkeypatch.setenv(int4_panel.PANEL_ENV, env)
    if taken == "vnni":  # the default: where the int4 panel's vector kernel runs
        taken = "int4" in int4_panel.fast_kinds()
    model = _model()
    adopted = adopt_panel(model, "cpu", dtype, head=model.head)
    want = [model.q4k, model.q41]
    assert adopted == (want if taken else [])
    for layer in want:
        assert isinstance(layer.quant_method, PanelInt4LinearMethod) == bool(taken)
    for other in (model.embed, model.odd, model.head):
        assert type(other.quant_method) is NativeInt4LinearMethod
    assert adopt_panel(model, "meta", dtype) == []
    # each choice has its own cache entry: switching the setting never rebuilds another's
    assert panel_scheme(adopted) == ("native-panel-all" if taken else "native")
    assert panel_scheme(adopted[:1]) == ("native-panel" if taken else "native")


def check_cache_round_trip(tmp_path, model, fresh, ggml_type, rows, panel, x):
    """``model.w`` (a panel layer) saved to a cache entry and mapped into ``fresh`` (a
    row-layout layer of the same method and shape, its rows filled) once its panel buffers
    are empty: the same outputs for ``x``; then ``to_rows`` (a cache that could not be
    mapped) gives back fillable row buffers (names ``rows``, none of ``panel``), filled from
    the blocks ``model.w`` came from and converted again: the same outputs. Shared by the
    int6 panel's test."""
    from localchat.engine.quant.cache import NATIVE_FORMAT, load_quantized_mmap, save_quantized

    n, k = model.w.out_features, model.w.in_features
    path = tmp_path / "entry.safetensors"
    save_quantized(model, path, {"scheme": "native", "format": NATIVE_FORMAT})
    assert f"w.{panel[0]}" in model.state_dict()

    other = nn.Module()
    other.w = fresh
    fresh.quant_method.to_panel(fresh, convert=False)
    assert load_quantized_mmap(other, path, fmt=NATIVE_FORMAT)
    assert torch.equal(other.w(x), model.w(x))

    fresh.quant_method.to_rows(fresh, "cpu")
    assert set(fresh._buffers) >= set(rows)
    assert not set(fresh._buffers) & set(panel)
    assert repack_into_rows(fresh, _random_blocks(ggml_type, n, k, seed=5), ggml_type,
                            (n, k), 0, n)
    fresh.quant_method.to_panel(fresh)
    assert torch.equal(other.w(x), model.w(x))


def test_cache_round_trip_and_back_to_rows(tmp_path):
    model = nn.Module()
    model.w, _ = _panel_layer(seed=5)
    check_cache_round_trip(tmp_path, model, _layer(PanelInt4LinearMethod("cpu"), seed=6), Q4_K,
                           int4_panel._ROW_NAMES, int4_panel._PANEL_NAMES,
                           activations(3, K, seed=4).bfloat16())


@pytest.mark.parametrize("isa", ["", "avx2", "scalar"])
def test_forced_panel_without_vnni_says_it_is_slow(monkeypatch, caplog, isa):
    """``LOCALCHAT_CPU_PANEL=1`` where the int4 panel's vector kernels do not run (the ISA
    capped below AVX2) takes the portable kernels, over 10x slower in a trial: one warning
    line; at the AVX2 level its AVX2 kernel runs, at AVX-512 with VNNI its VNNI one."""
    import logging

    monkeypatch.setenv(int4_panel.PANEL_ENV, "1")
    monkeypatch.setenv("LOCALCHAT_CPU_ISA", isa)  # re-read at once (tests/conftest.py)
    vector = cpu.active_isa() >= 1
    with caplog.at_level(logging.WARNING, logger="localchat.engine.quant.int4_panel"):
        assert adopt_panel(_model(), "cpu", torch.bfloat16)
    said = [r.getMessage() for r in caplog.records if "portable code" in r.getMessage()]
    assert len(said) == (0 if vector else 1)


@pytest.mark.parametrize("a8_fp32", [False, True])
def test_fp32_engine_takes_the_panel_only_when_it_decodes_with_integer_dots(monkeypatch,
                                                                            a8_fp32):
    """fp32 activations take the panel (by default where its kernels run) only for an engine
    that decodes through the integer-dot kernels (``LLMEngine.a8_fp32``, an fp32 picked for a
    CPU without native bf16); an fp32 engine asked for keeps the row layout's exact kernels,
    as does ``LOCALCHAT_CPU_A8=0``."""
    monkeypatch.setenv(int4_panel.PANEL_ENV, "")
    model = _model()
    taken = a8_fp32 and "int4" in int4_panel.fast_kinds()
    assert adopt_panel(model, "cpu", torch.float32, head=model.head, a8_fp32=a8_fp32) == (
        [model.q4k, model.q41] if taken else [])
    monkeypatch.setenv("LOCALCHAT_CPU_A8", "0")  # re-read at once (tests/conftest.py)
    assert adopt_panel(_model(), "cpu", torch.float32, a8_fp32=True) == []
