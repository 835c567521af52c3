"""The C++ GGUF repack (``localchat.kernels.cpu.gguf_repack``) against its reference, the numpy
path of ``engine.quant.gguf_repack`` (``_repack_numpy``), bit for bit.

Every GGML type the op takes, on random valid blocks (random bytes, the fp16 ``d`` / ``dmin``
fields set to finite values of both signs from subnormal-adjacent to large, as
``tests/engine/quant/test_gguf_repack.py`` builds them) and on SmolLM2's real tensors:
``qweight``, ``scales`` and ``mins`` compared as raw bits (so ``-0.0`` mins and fp16 bits
count). Odd row counts, one block per row and many, a row count above the thread grain (two
threads' chunks), a row permutation (the loader's Q/K unpermute), the fp16 overflow count,
the launcher's checks, and ``repack_gguf_tensor`` falling back to numpy without the kernels.
The op has no ISA-specific paths (portable code the compiler vectorizes), so there is no
``LOCALCHAT_CPU_ISA`` case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.engine.errors import ModelLoadError
from localchat.engine.quant import gguf_repack as gr
from localchat.kernels import cpu
from tests.engine.quant.test_gguf_repack import _random_blocks

TYPES = sorted(cpu.GGUF_REPACK_TYPES)

def random_blocks(ggml_type: int, n: int, k: int, seed: int) -> np.ndarray:
    """``[n * k / block * type_size]`` uint8 of valid blocks (finite fp16 scale fields):
    ``test_gguf_repack``'s generator, flattened."""
    return _random_blocks(ggml_type, n, k, seed).reshape(-1)


def _bits(t: torch.Tensor | None):
    if t is None:
        return None
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(got: gr.RepackedWeight, want: gr.RepackedWeight) -> None:
    assert (got.layout, got.group_size, got.ggml_type) == (want.layout, want.group_size,
                                                            want.ggml_type)
    for a, b in ((got.qweight, want.qweight), (got.scales, want.scales),
                 (got.mins, want.mins), (got.super_scales, want.super_scales)):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
            assert torch.equal(_bits(a), _bits(b))


def _op(raw: np.ndarray, ggml_type: int, n: int, k: int, rows=None) -> gr.RepackedWeight:
    """The C++ op alone into fresh outputs (``n`` output rows)."""
    name, _, _, layout = gr.GGML_TYPES[ggml_type]
    group, has_mins = gr.repacked_group(ggml_type)
    sd = gr.scale_dtype(ggml_type)
    q = torch.empty(n, k // 2, dtype=torch.uint8) if layout == "int4" else torch.empty(
        n, k, dtype=torch.int8)
    s = torch.empty(n, k // group, dtype=sd)
    m = torch.empty(n, k // group, dtype=sd) if has_mins else None
    sup = torch.empty(n, k // 256, 2, dtype=torch.float16) if name in gr.TWO_LEVEL_TYPES \
        else None
    assert cpu.gguf_repack(torch.from_numpy(raw), ggml_type, q, s, m, rows, sup) == 0
    return gr.RepackedWeight(layout, q, s, m, group, name, sup)


def _shapes(ggml_type: int):
    block = gr.GGML_TYPES[ggml_type][1]
    return [(1, block), (7, block), (13, 3 * block), (5, 17 * block)] if block == 32 else \
        [(1, 256), (3, 256), (11, 768), (2, 1536)]


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: gr.GGML_TYPES[t][0])
def test_random_blocks_equal_numpy(built, ggml_type):
    for i, (n, k) in enumerate(_shapes(ggml_type)):
        raw = random_blocks(ggml_type, n, k, seed=100 * ggml_type + i)
        want = gr._repack_numpy(raw, ggml_type, (n, k))
        assert_same(_op(raw, ggml_type, n, k), want)
        assert_same(gr.repack_gguf_tensor(raw, ggml_type, (n, k)), want)


@pytest.mark.parametrize("ggml_type", [3, 12, 14], ids=lambda t: gr.GGML_TYPES[t][0])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_over_threads(built, ggml_type, threads):
    """More rows than one thread's grain (256 KiB of source bytes): two chunks."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n, k = 1201, 512  # Q4_1: 320 B per row -> grain 819 rows; K-quants: 288 / 420 B
        raw = random_blocks(ggml_type, n, k, seed=ggml_type)
        assert_same(_op(raw, ggml_type, n, k), gr._repack_numpy(raw, ggml_type, (n, k)))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("ggml_type", [3, 8, 12, 14], ids=lambda t: gr.GGML_TYPES[t][0])
def test_row_permutation_is_the_unpermute(built, ggml_type):
    """``rows`` as the loader passes it (llama's Q/K unpermute) equals ``unpermute_rows`` of
    the numpy result; an arbitrary selection with repeats picks those source rows."""
    n_head, n = 4, 24
    k = gr.GGML_TYPES[ggml_type][1] * 2
    raw = random_blocks(ggml_type, n, k, seed=3)
    want = gr._repack_numpy(raw, ggml_type, (n, k))
    rows = gr.unpermute_source_rows(n, n_head)
    assert_same(_op(raw, ggml_type, n, k, rows), gr.unpermute_rows(want, n_head))
    pick = torch.tensor([5, 0, 5, 23, 7])
    got = _op(raw, ggml_type, len(pick), k, pick)
    sel = gr.RepackedWeight(want.layout, want.qweight[pick], want.scales[pick],
                            None if want.mins is None else want.mins[pick], want.group_size,
                            want.ggml_type,
                            None if want.super_scales is None else want.super_scales[pick])
    assert_same(got, sel)


def test_q4_0_fp16_overflow_is_counted_and_refused(built):
    raw = random_blocks(2, 4, 64, seed=0)
    raw.reshape(-1, 18)[3, 0:2] = np.array([60000.0], np.float16).view(np.uint8)  # -8 d: inf
    q = torch.empty(4, 32, dtype=torch.uint8)
    s, m = torch.empty(4, 2, dtype=torch.float16), torch.empty(4, 2, dtype=torch.float16)
    assert cpu.gguf_repack(torch.from_numpy(raw), 2, q, s, m) == 1
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight.*fp16 range"):
        gr.repack_gguf_tensor(raw, 2, (4, 64), "blk.0.ffn_up.weight")


def test_launcher_checks(built):
    raw = torch.from_numpy(random_blocks(12, 2, 256, seed=0))  # Q4_K
    q = torch.empty(2, 128, dtype=torch.uint8)
    s, m = torch.empty(2, 8), torch.empty(2, 8)
    cases = [
        (raw, 99, q, s, m, None, "unsupported GGML type"),
        (raw, 12, q.view(torch.int8), s, m, None, "qweight"),
        (raw, 12, q, s.half(), m.half(), None, "scales"),
        (raw, 12, q, s, None, None, "needs mins"),
        (raw[:-1], 12, q, s, m, None, "whole rows"),
        (raw, 12, q[:1], s[:1], m[:1], None, "hold 2 rows"),
        (raw, 12, q, s, m, torch.tensor([0, 2]), "outside"),
        (raw, 14, torch.empty(2, 256, dtype=torch.int8), torch.empty(2, 16), torch.empty(2, 16),
         None, "has no mins"),
    ]
    for r, t, qq, ss, mm, rows, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            cpu.gguf_repack(r, t, qq, ss, mm, rows)


def test_without_the_kernels_numpy_repacks(built, monkeypatch):
    raw = random_blocks(12, 3, 256, seed=1)
    want = gr.repack_gguf_tensor(raw, 12, (3, 256))
    monkeypatch.setattr(cpu, "available", lambda: False)
    q, s, m = torch.empty(3, 128, dtype=torch.uint8), torch.empty(3, 8), torch.empty(3, 8)
    assert not gr.repack_gguf_into(raw, 12, (3, 256), q, s, m)
    assert_same(gr.repack_gguf_tensor(raw, 12, (3, 256)), want)


def test_smollm2_real_tensors_equal_numpy(built, smollm2_gguf):
    """Every quantized tensor of SmolLM2's file (Q4_1 projections, the Q8_0 embedding): the
    C++ repack equals the numpy one, and with the Q/K unpermute as its row order equals
    ``unpermute_rows``."""
    import gguf

    reader = gguf.GGUFReader(str(smollm2_gguf))
    heads = int(reader.fields["llama.attention.head_count"].parts[-1][0])
    kv_heads = int(reader.fields["llama.attention.head_count_kv"].parts[-1][0])
    names = set()
    for t in reader.tensors:
        if int(t.tensor_type) not in cpu.GGUF_REPACK_TYPES:
            continue
        shape = tuple(reversed([int(d) for d in t.shape.tolist()]))
        raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
        want = gr._repack_numpy(raw, int(t.tensor_type), shape, t.name)
        assert_same(gr.repack_gguf_tensor(t.data, int(t.tensor_type), shape, t.name), want)
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            h = heads if "attn_q" in t.name else kv_heads
            rows = gr.unpermute_source_rows(shape[0], h)
            assert_same(_op(raw, int(t.tensor_type), *shape, rows), gr.unpermute_rows(want, h))
        names.add(gr.GGML_TYPES[int(t.tensor_type)][0])
    assert names == {"Q4_1", "Q8_0"}
