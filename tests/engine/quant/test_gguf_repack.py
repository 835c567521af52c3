"""Exact GGUF repacking: random valid blocks and SmolLM2's real tensors, repacked onto the
engine's layouts and dequantized by the engine, equal ``gguf.quants.dequantize`` bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from localchat.engine.errors import ModelLoadError
from localchat.engine.loader.gguf import _unpermute
from localchat.engine.quant.gguf_repack import (
    GGML_TYPES,
    dequantize_repacked,
    repack_gguf_tensor,
    scale_dtype,
    tensor_nbytes,
    unpermute_rows,
)

# byte offsets of the fp16 super-scales (d, dmin) inside one block, per type
_F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
_QUANT_TYPES = [t for t, v in GGML_TYPES.items() if v[3] != "float"]
_FLOAT_TYPES = [t for t, v in GGML_TYPES.items() if v[3] == "float"]


def _random_blocks(ggml_type: int, n: int, k: int, seed: int) -> np.ndarray:
    """``[n, row_bytes]`` uint8: random bytes with finite fp16 scale fields (both signs,
    magnitudes from subnormal-adjacent to large)."""
    name, block, type_size, _ = GGML_TYPES[ggml_type]
    rng = np.random.default_rng(seed)
    nb = n * k // block
    raw = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    for off in _F16_FIELDS[name]:
        mag = np.exp2(rng.uniform(-14, 4, nb)) * rng.choice([-1.0, 1.0], nb)
        raw[:, off:off + 2] = mag.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, k // block * type_size)


@pytest.mark.parametrize("ggml_type", _QUANT_TYPES, ids=lambda t: GGML_TYPES[t][0])
def test_random_blocks_repack_exactly(ggml_type):
    n, k = 12, 512
    raw = _random_blocks(ggml_type, n, k, seed=ggml_type)
    w = repack_gguf_tensor(raw, ggml_type, (n, k), "blk.0.ffn_up.weight")
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type)))
    got = dequantize_repacked(w)
    assert got.dtype == torch.float32 and got.shape == (n, k)
    assert torch.equal(got, want)
    layout = GGML_TYPES[ggml_type][3]
    assert w.layout == layout
    if layout == "int4":
        assert w.qweight.dtype == torch.uint8 and w.qweight.shape == (n, k // 2)
        assert w.group_size == 32 and w.mins is not None
    else:
        assert w.qweight.dtype == torch.int8 and w.qweight.shape == (n, k)
        assert w.group_size in (16, 32)
    # fp16 block scales stay fp16 (exactly), Q4_K keeps its file's two levels (uint8
    # sub-block scales / mins, fp16 d and -dmin), the other K-quants' products d * sc fp32
    name = GGML_TYPES[ggml_type][0]
    want_dtype = torch.float16 if name in (
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL") else \
        torch.uint8 if name == "Q4_K" else torch.float32
    assert scale_dtype(ggml_type) == want_dtype
    assert w.scales.dtype == want_dtype and w.scales.shape == (n, k // w.group_size)
    assert w.mins is None or w.mins.dtype == want_dtype
    if name == "Q4_K":
        assert w.super_scales.dtype == torch.float16 and w.super_scales.shape == (n, k // 256, 2)
        assert w.nbytes() * 18 == tensor_nbytes(ggml_type, (n, k)) * 18.5
    else:
        assert w.super_scales is None


def test_q4_0_min_out_of_fp16_range_is_refused():
    raw = _random_blocks(2, 4, 64, seed=0)  # Q4_0
    raw.reshape(-1, 18)[3, 0:2] = np.array([60000.0], np.float16).view(np.uint8)  # -8 d: inf
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight.*fp16 range"):
        repack_gguf_tensor(raw, 2, (4, 64), "blk.0.ffn_up.weight")


@pytest.mark.parametrize("ggml_type", _FLOAT_TYPES, ids=lambda t: GGML_TYPES[t][0])
def test_float_tensors_stay_as_they_are(ggml_type):
    name = GGML_TYPES[ggml_type][0]
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[name]
    raw = x.to(torch_dtype).view(torch.uint8).numpy() if name != "F32" else x.numpy()
    w = repack_gguf_tensor(raw, ggml_type, (6, 64))
    assert w.layout == "float" and w.qweight.dtype == torch_dtype
    want = gguf.quants.dequantize(raw.view(np.uint8) if name == "BF16" else raw.view(
        {"F32": np.float32, "F16": np.float16}.get(name, np.uint8)),
        gguf.GGMLQuantizationType(ggml_type))
    assert torch.equal(dequantize_repacked(w), torch.from_numpy(np.asarray(want, np.float32)))


def test_unsupported_type_names_tensor_and_type():
    raw = np.zeros((4, 66), dtype=np.uint8)
    with pytest.raises(ModelLoadError, match=r"blk\.3\.attn_q\.weight.*IQ2_XXS"):
        repack_gguf_tensor(raw, int(gguf.GGMLQuantizationType.IQ2_XXS), (4, 256),
                           "blk.3.attn_q.weight")


def test_wrong_byte_count_is_one_clear_error():
    raw = _random_blocks(3, 4, 64, seed=0)[:, :-1]
    with pytest.raises(ModelLoadError, match="corrupt"):
        repack_gguf_tensor(raw, 3, (4, 64), "blk.0.attn_k.weight")


def test_unpermute_moves_quantized_rows_like_the_float_rows():
    n_head, n, k = 4, 32, 64
    raw = _random_blocks(3, n, k, seed=7)
    w = repack_gguf_tensor(raw, 3, (n, k))
    want = _unpermute(dequantize_repacked(w).numpy(), n_head)
    assert torch.equal(dequantize_repacked(unpermute_rows(w, n_head)), torch.from_numpy(want))


def test_smollm2_real_tensors_repack_exactly(smollm2_gguf):
    """Every distinct (type, shape) of SmolLM2's file (Q4_1 projections, the Q8_0 embedding,
    F32 norms) repacks to gguf's dequantization bit for bit."""
    reader = gguf.GGUFReader(str(smollm2_gguf))
    seen: set[tuple] = set()
    checked = 0
    for t in reader.tensors:
        key = (int(t.tensor_type), tuple(t.shape.tolist()))
        if key in seen:
            continue
        seen.add(key)
        shape = tuple(reversed([int(d) for d in t.shape.tolist()]))
        w = repack_gguf_tensor(t.data, int(t.tensor_type), shape, t.name)
        want = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        assert torch.equal(dequantize_repacked(w), torch.from_numpy(want.reshape(shape))), t.name
        checked += 1
    names = {GGML_TYPES[k[0]][0] for k in seen}
    assert {"Q4_1", "Q8_0", "F32"} <= names and checked >= 5
