"""Single rows of the int6 and int8 panel layouts by id (``kernels/cpu/panel_gather.cpp``,
``cpu.int{6,8}_panel_gather``): what the greedy output layer rescores and a tied panel
embedding looks up.

- Every gathered row equals the row layout's reference dequantization bit for bit
  (``reference.dequantize_int6``, ``dequantize_int8_grouped``: ``gguf.quants.dequantize``'s
  values), for ids unsorted, repeated, at both ends and in every lane of a tile, on random and
  extreme weights (Q6_K: every u = 0 / 63 with scales -128 / 127; Q8_0: every q = -128 / 127),
  and for no ids at all.
- One thread and two give the same bits; the op rejects bad ids and outputs.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int6_panel import to_panel6
from localchat.engine.quant.int8 import dequantize_int8_grouped
from localchat.engine.quant.int8_panel import to_panel8
from localchat.kernels import cpu, reference

from .test_cpu_panel8 import q8_weights
from .test_cpu_quant_a8 import built  # noqa: F401
from .test_int6 import cpp_int6, q6_blocks

SHAPES6 = [(16, 256), (48, 512), (80, 1536)]  # (N, K): 1, 3 and 5 tiles
SHAPES8 = [(16, 32), (48, 576), (32, 160)]    # K % 128 != 0 included


def _ids(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ends = torch.tensor([n - 1, 0, 15, 16 % n, 0, n - 1, n // 2])
    return torch.cat([ends, torch.arange(16), torch.randint(0, n, (40,), generator=gen)])


def _gather6(panel, ids):
    out = torch.empty(len(ids), panel[0].shape[1] * 8)
    cpu.int6_panel_gather(*panel, ids, out)
    return out


def _gather8(panel, ids):
    out = torch.empty(len(ids), panel[0].shape[1] * 4)
    cpu.int8_panel_gather(*panel, ids, out)
    return out


@pytest.mark.parametrize("extreme", [None, "low", "high"])
@pytest.mark.parametrize("n,k", SHAPES6)
def test_int6_rows_equal_reference(built, n, k, extreme):  # noqa: F811
    w = cpp_int6(q6_blocks(n, k, seed=n + k, extreme=extreme), n, k)
    want = reference.dequantize_int6(*w)
    ids = _ids(n, seed=k)
    got = _gather6(to_panel6(*w), ids)
    assert torch.equal(got.view(torch.int32), want[ids].view(torch.int32))


@pytest.mark.parametrize("extreme", [None, -128, 127])
@pytest.mark.parametrize("n,k", SHAPES8)
def test_int8_rows_equal_reference(built, n, k, extreme):  # noqa: F811
    w = q8_weights(n, k, seed=n * k, extreme=extreme)
    want = dequantize_int8_grouped(*w)
    ids = _ids(n, seed=k)
    got = _gather8(to_panel8(*w), ids)
    assert torch.equal(got.view(torch.int32), want[ids].view(torch.int32))


def test_no_ids_and_thread_invariance(built):  # noqa: F811
    p6 = to_panel6(*cpp_int6(q6_blocks(80, 512, seed=3), 80, 512))
    p8 = to_panel8(*q8_weights(80, 576, seed=3))
    none = torch.empty(0, dtype=torch.int64)
    assert _gather6(p6, none).shape == (0, 512) and _gather8(p8, none).shape == (0, 576)
    ids = torch.randint(0, 80, (200,), generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = (_gather6(p6, ids), _gather8(p8, ids))
        torch.set_num_threads(2)
        two = (_gather6(p6, ids), _gather8(p8, ids))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_rejects_bad_ids_and_outputs(built):  # noqa: F811
    p6 = to_panel6(*cpp_int6(q6_blocks(32, 256, seed=1), 32, 256))
    p8 = to_panel8(*q8_weights(32, 256, seed=1))
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 32 outside \[0, 32\)"):
        cpu.int6_panel_gather(*p6, torch.tensor([0, 32]), torch.empty(2, 256))
    with pytest.raises(RuntimeError, match="outside"):
        cpu.int8_panel_gather(*p8, torch.tensor([-1]), torch.empty(1, 256))
    with pytest.raises(RuntimeError, match="int64"):
        cpu.int8_panel_gather(*p8, torch.tensor([0], dtype=torch.int32), torch.empty(1, 256))
    with pytest.raises(RuntimeError, match="out must be contiguous fp32"):
        cpu.int6_panel_gather(*p6, torch.tensor([0]), torch.empty(1, 128))
    with pytest.raises(RuntimeError, match="out must be contiguous fp32"):
        cpu.int8_panel_gather(*p8, torch.tensor([0]), torch.empty(1, 256, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="psuper"):
        cpu.int6_panel_gather(p6[0], p6[1], p6[2], p6[3].float(), torch.tensor([0]),
                              torch.empty(1, 256))
    with pytest.raises(RuntimeError, match="pscales must be"):
        cpu.int8_panel_gather(p8[0], p8[1].float(), torch.tensor([0]), torch.empty(1, 256))
