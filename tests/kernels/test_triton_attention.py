"""Triton paged decode and varlen prefill attention against ``kernels.reference``.

The caches come from ``PagedSetup`` (shuffled, non-contiguous block tables; unused slots and
blocks hold NaN, so a kernel that reads past a sequence's end fails). Grid: (num_heads,
num_kv_heads), head_dim, block_size, dtype; every case batches sequences of the boundary
lengths 1, block_size - 1, block_size + 1 and 300 tokens. bf16 results must also be no further
from a float64 evaluation of the reference than the bf16 reference itself is (plus one ulp).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from localchat.kernels import reference
from localchat.kernels.triton_decode import paged_attention_decode
from localchat.kernels.triton_prefill import prefill_attention

from .test_reference import PagedSetup
from .triton_cases import BLOCK_SIZES, DTYPES, HEAD_DIMS, HEADS, LONG, assert_close

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


def _check_not_worse_than_reference(out, ref, exact):
    """bf16: the kernel's max error vs float64 is within the bf16 reference's own error plus
    two bf16 ulps of the largest output (the kernel rounds p to bf16 before P @ V, as
    FlashAttention does, and the interpreter's fp32 -> bf16 cast may round differently)."""
    err_kernel = (out.double().cpu() - exact).abs().max().item()
    err_ref = (ref.double().cpu() - exact).abs().max().item()
    ulp = 2.0 ** (torch.log2(exact.abs().max()).floor().item() - 7)
    assert err_kernel <= err_ref + 2 * ulp, (err_kernel, err_ref, ulp)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_heads,num_kv_heads", HEADS)
def test_decode_matches_reference(num_heads, num_kv_heads, head_dim, block_size, dtype,
                                  device):
    seq_lens = [1, block_size - 1, block_size + 1, LONG]
    st = PagedSetup(seq_lens, num_heads, num_kv_heads, head_dim, block_size,
                    seed=num_heads * 100 + head_dim + block_size, dtype=dtype)
    gen = torch.Generator().manual_seed(head_dim + block_size)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(seq_lens)
    scale = head_dim ** -0.5
    ref = reference.paged_attention_decode(query, st.key_cache, st.value_cache,
                                           st.block_tables, lens, scale)
    q, kc, vc, bt, sl = _on(device, query, st.key_cache, st.value_cache, st.block_tables, lens)
    # num_splits=1: the single-pass kernel; 3: split-K with 3 partitions of the
    # block-table span, some of them empty for the short sequences.
    for num_splits in (1, 3):
        out = paged_attention_decode(q, kc, vc, bt, sl, scale, num_splits=num_splits)
        assert_close(out, ref, dtype)
        if dtype == torch.bfloat16:
            exact = reference.paged_attention_decode(
                query.double(), st.key_cache.double(), st.value_cache.double(),
                st.block_tables, lens, scale)
            _check_not_worse_than_reference(out, ref, exact)


def test_decode_split_k_over_a_length_bucket_of_a_wide_table(device):
    """The engine's call: a 4096-token block table (max_model_len) holding sequences of at
    most 600 tokens, ``max_seq_len`` = their length bucket (1024), default split-K: the
    partitions cover the bucket only and the result equals the reference (and the table-wide
    call). The padding entries of the table point to a NaN block."""
    from localchat.engine.attention_metadata import seq_len_bucket

    seq_lens = [1, 17, 600]
    st = PagedSetup(seq_lens, 8, 2, 64, 16, seed=5)
    width = 4096 // 16
    bt = torch.cat([st.block_tables, st.block_tables[:, -1:].expand(
        -1, width - st.block_tables.shape[1])], dim=1).contiguous()
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(len(seq_lens), 8, 64, generator=gen)
    lens = torch.tensor(seq_lens)
    ref = reference.paged_attention_decode(query, st.key_cache, st.value_cache, bt, lens,
                                           0.125)
    q, kc, vc, bt_d, sl = _on(device, query, st.key_cache, st.value_cache, bt, lens)
    bucket = seq_len_bucket(max(seq_lens))
    assert bucket == 1024
    from localchat.kernels.triton_decode import partitioning

    splits, partition = partitioning(len(seq_lens), 2, bucket, q.device)
    assert splits > 1 and splits * partition >= bucket  # the split-K path, over the bucket
    for bound in (bucket, None):
        out = paged_attention_decode(q, kc, vc, bt_d, sl, 0.125, max_seq_len=bound)
        assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_heads,num_kv_heads", HEADS)
def test_prefill_matches_reference(num_heads, num_kv_heads, head_dim, block_size, dtype,
                                   device):
    bs = block_size
    # (cached prefix, query chunk): whole prompts of 1, bs - 1 and bs + 1 tokens; a 64-token
    # chunk after a 236-token prefix (300 in all); one decode-like row; a 5-row speculative
    # verification (k = 4) at the end of a long context; an empty chunk.
    plan = [(0, 1), (0, bs - 1), (0, bs + 1), (LONG - 64, 64), (LONG - 1, 1), (LONG - 5, 5),
            (3, 0)]
    seq_lens = [p + q for p, q in plan]
    chunks = [[(0, p), (p, p + q)] for p, q in plan]
    st = PagedSetup(seq_lens, num_heads, num_kv_heads, head_dim, bs,
                    seed=num_heads * 77 + head_dim + bs, dtype=dtype, store_in_chunks=chunks)
    gen = torch.Generator().manual_seed(head_dim * 3 + bs)
    q_lens = [q for _, q in plan]
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + q_lens).cumsum(0)
    lens = torch.tensor(seq_lens)
    ref = reference.prefill_attention(query, st.key_cache, st.value_cache, qsl, lens,
                                      st.block_tables, 0.3)
    q, kc, vc, qs, sl, bt = _on(device, query, st.key_cache, st.value_cache, qsl, lens,
                                st.block_tables)
    out = prefill_attention(q, kc, vc, qs, sl, bt, 0.3)
    assert_close(out, ref, dtype)
    if dtype == torch.bfloat16:
        exact = reference.prefill_attention(query.double(), st.key_cache.double(),
                                            st.value_cache.double(), qsl, lens,
                                            st.block_tables, 0.3)
        _check_not_worse_than_reference(out, ref, exact)


def test_prefill_given_max_query_len_equals_derived(device):
    st = PagedSetup([20, 7], 4, 2, 64, 16, seed=5)
    query = torch.randn(12, 4, 64, generator=torch.Generator().manual_seed(1))
    qsl, lens = torch.tensor([0, 5, 12]), torch.tensor([20, 7])
    args = _on(device, query, st.key_cache, st.value_cache, qsl, lens, st.block_tables)
    derived = prefill_attention(*args, 0.125)
    given = prefill_attention(*args, 0.125, max_query_len=7)
    assert torch.equal(derived, given)
    assert_close(given, reference.prefill_attention(query, st.key_cache, st.value_cache, qsl,
                                                    lens, st.block_tables, 0.125).to(device),
                 torch.float32)


def test_launchers_reject_bad_inputs(device):
    st = PagedSetup([5], 4, 2, 64, 16, seed=2)
    q = torch.randn(1, 4, 64, device=device)
    kc, vc, bt = _on(device, st.key_cache, st.value_cache, st.block_tables)
    with pytest.raises(ValueError, match="does not fit"):
        paged_attention_decode(torch.randn(1, 3, 64, device=device), kc, vc, bt,
                               torch.tensor([5], device=device), 0.1)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_attention_decode(q.bfloat16(), kc, vc, bt, torch.tensor([5], device=device), 0.1)
    with pytest.raises(ValueError, match="rows"):
        paged_attention_decode(q, kc, vc, bt, torch.tensor([5, 5], device=device), 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        paged_attention_decode(torch.randn(1, 4, 128, device=device)[..., ::2], kc, vc, bt,
                               torch.tensor([5], device=device), 0.1)
    with pytest.raises(ValueError, match="disagree"):
        prefill_attention(q, kc, vc, torch.tensor([0], device=device),
                          torch.tensor([5], device=device), bt, 0.1)
