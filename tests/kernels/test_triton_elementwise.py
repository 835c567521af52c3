"""Triton ``store_kv_cache``, ``rms_norm``, ``fused_add_rms_norm`` and ``apply_rope`` against
``kernels.reference`` (and, for the KV writes, exact equality on every slot)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from localchat.engine.layers.rotary import RotaryEmbedding
from localchat.kernels import reference
from localchat.kernels.triton_kv import store_kv_cache
from localchat.kernels.triton_norm import fused_add_rms_norm, rms_norm
from localchat.kernels.triton_rope import apply_rope

from .triton_cases import BLOCK_SIZES, DTYPES, HEAD_DIMS, HEADS, assert_close

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 64), (4, 128), (2, 24)])
def test_store_kv_cache_equals_reference(num_kv_heads, head_dim, block_size, dtype, device):
    gen = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks = 6
    num_tokens = 2 * block_size + 3
    # K/V are slices of a fused qkv row (token stride > num_kv_heads * head_dim)
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype)
    row = num_kv_heads * head_dim
    key = qkv[:, row : 2 * row].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, 2 * row :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding tokens
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    ref_k, ref_v = torch.full(shape, 7.0, dtype=dtype), torch.full(shape, 7.0, dtype=dtype)
    reference.store_kv_cache(key, value, ref_k, ref_v, slots)
    kc, vc = ref_k.new_full(shape, 7.0).to(device), ref_v.new_full(shape, 7.0).to(device)
    store_kv_cache(key.to(device), value.to(device), kc, vc, slots.to(device))
    assert torch.equal(kc.cpu(), ref_k) and torch.equal(vc.cpu(), ref_v)
    # the int32 slot mapping writes the same
    kc32, vc32 = ref_k.new_full(shape, 7.0).to(device), ref_v.new_full(shape, 7.0).to(device)
    store_kv_cache(key.to(device), value.to(device), kc32, vc32, slots.int().to(device))
    assert torch.equal(kc32.cpu(), ref_k) and torch.equal(vc32.cpu(), ref_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (3, 14, 24), (2, 4096)])
def test_rms_norm_equals_reference(shape, dtype, device):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    out = rms_norm(x.to(device), w.to(device), 1e-5)
    assert_close(out, reference.rms_norm(x, w, 1e-5), dtype)


def test_rms_norm_fp32_weight_promotes_like_reference(device):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    w = torch.rand(64, generator=torch.Generator().manual_seed(1))
    out = rms_norm(x.to(device), w.to(device), 1e-6)
    assert out.dtype == torch.float32
    assert_close(out, reference.rms_norm(x, w, 1e-6), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 64), (7, 576), (2, 4096)])
def test_fused_add_rms_norm_equals_reference_in_place(num_tokens, hidden, dtype, device):
    gen = torch.Generator().manual_seed(hidden + num_tokens)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    residual = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    ref_out, ref_res = reference.fused_add_rms_norm(x, residual, w, 1e-6)
    xd, rd = x.to(device), residual.to(device)
    out, res = fused_add_rms_norm(xd, rd, w.to(device), 1e-6)
    # The sum is rounded to the residual dtype as torch's add does: bit-exact in fp32 and on a
    # GPU; the 3.9 interpreter truncates fp32 -> bf16 (no round-to-nearest), so 1 ulp there.
    if dtype == torch.float32 or res.is_cuda:
        assert torch.equal(res.cpu(), ref_res)
    else:
        assert_close(res, ref_res, dtype)
    assert_close(out, ref_out, dtype)
    # in-place contract: the returned tensors are the input buffers
    assert out.data_ptr() == xd.data_ptr() and res.data_ptr() == rd.data_ptr()


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["plain", "llama3"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS + [24])
@pytest.mark.parametrize("num_heads,num_kv_heads", HEADS)
def test_apply_rope_equals_reference(num_heads, num_kv_heads, head_dim, scaling, dtype,
                                     device):
    gen = torch.Generator().manual_seed(num_heads + head_dim)
    rope = RotaryEmbedding(head_dim, 512, 500000.0, scaling)
    num_tokens = 9
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen).to(dtype)
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)  # strided views, as in the model
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.cat([torch.tensor([0, 1, 511]),
                           torch.randint(0, 512, (num_tokens - 3,), generator=gen)])
    ref_q, ref_k = reference.apply_rope(positions, q, k, rope.cos_sin_cache)
    out_q, out_k = apply_rope(positions.to(device), q.to(device), k.to(device),
                              rope.cos_sin_cache.to(device))
    assert_close(out_q, ref_q, dtype)
    assert_close(out_k, ref_k, dtype)


def test_elementwise_launchers_reject_bad_inputs(device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(4, device=device), 1e-6)
    with pytest.raises(ValueError, match="must match"):
        fused_add_rms_norm(x, x.bfloat16(), torch.ones(8, device=device), 1e-6)
    cache = torch.zeros(4, 16, 2, 8, device=device)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv_cache(torch.zeros(3, 2, 8, device=device), torch.zeros(3, 2, 8, device=device),
                       cache, cache.clone(), torch.zeros(2, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="cos_sin_cache"):
        apply_rope(torch.zeros(2, dtype=torch.long, device=device),
                   torch.zeros(2, 4, 8, device=device), torch.zeros(2, 2, 8, device=device),
                   torch.zeros(16, 6, device=device))
