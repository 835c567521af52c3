"""The PyTorch reference ops against independent computations written here.

- Paged attention: K/V for several sequences are scattered with ``store_kv_cache`` into a
  NaN-filled cache through random, non-contiguous block tables (padding slots ``-1`` mixed
  in), then ``paged_attention_decode`` and ``prefill_attention`` are compared with a naive
  float64 ``softmax(Q K^T * scale + causal mask) V`` on the contiguous tensors, query head ``h``
  reading KV head ``h // (num_heads // num_kv_heads)`` by an explicit loop.
- ``rms_norm`` / ``fused_add_rms_norm`` against the formula in float64.
- ``apply_rope`` against a complex-number rotation (neox layout: dim ``i`` pairs with
  ``i + head_dim / 2``) with angles ``pos * theta ** (-2i / head_dim)``.
"""

from __future__ import annotations

import pytest
import torch

from localchat.kernels.reference import (
    apply_rope,
    fused_add_rms_norm,
    gather_kv,
    paged_attention_decode,
    prefill_attention,
    rms_norm,
    store_kv_cache,
)

# Tiny tensors: one thread avoids OpenMP barrier stalls on a busy 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


HEADS = [(4, 4), (8, 2), (6, 2)]
HEAD_DIMS = [32, 64]
BLOCK_SIZES = [16, 32]


def naive_attention(q, k, v, num_cached, scale):
    """``q [q_len, H, D]`` are positions ``num_cached .. num_cached + q_len - 1`` of
    ``k, v [kv_len, H_kv, D]``. float64. Returns ``[q_len, H, D]``."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, num_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kv_of_head = [h // group for h in range(num_heads)]  # query head h reads KV head h // group
    k, v = k[:, kv_of_head], v[:, kv_of_head]  # [kv_len, H, D]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    # query i sees keys 0 .. num_cached + i
    visible = torch.arange(kv_len)[None, :] <= num_cached + torch.arange(q_len)[:, None]
    w = torch.exp(scores - scores.max(dim=-1, keepdim=True).values) * visible
    probs = w / w.sum(dim=-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", probs, v)


class PagedSetup:
    """Sequences of the given lengths stored in a shuffled paged cache."""

    def __init__(self, seq_lens, num_heads, num_kv_heads, head_dim, block_size, seed,
                 dtype=torch.float32, store_in_chunks=None):
        gen = torch.Generator().manual_seed(seed)
        self.block_size = block_size
        self.seq_lens = seq_lens
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 5  # spare blocks stay NaN
        perm = torch.randperm(num_blocks, generator=gen).tolist()
        max_blocks = max(blocks_per_seq) + 1
        self.block_tables = torch.full((len(seq_lens), max_blocks), num_blocks - 1,
                                       dtype=torch.int32)
        i = 0
        for s, nb in enumerate(blocks_per_seq):
            self.block_tables[s, :nb] = torch.tensor(perm[i : i + nb], dtype=torch.int32)
            i += nb
        # Pad rows with a block that belongs to no sequence: reading it would give NaN.
        unused = perm[i]
        for s, nb in enumerate(blocks_per_seq):
            self.block_tables[s, nb:] = unused
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_cache = torch.full(shape, float("nan"), dtype=dtype)
        self.value_cache = torch.full(shape, float("nan"), dtype=dtype)
        self.keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
                     for n in seq_lens]
        self.values = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
                       for n in seq_lens]
        # Store every token, in a few calls, in shuffled order, with -1 padding rows between.
        splits = store_in_chunks or [[(0, n)] for n in seq_lens]
        calls = max(len(c) for c in splits)
        for c in range(calls):
            ks, vs, slots = [], [], []
            for s, chunks in enumerate(splits):
                if c >= len(chunks):
                    continue
                a, b = chunks[c]
                for t in range(a, b):
                    ks.append(self.keys[s][t])
                    vs.append(self.values[s][t])
                    slots.append(self.slot(s, t))
                    # a padding token with garbage K/V that must not land anywhere
                    ks.append(torch.full_like(self.keys[s][t], 1e4))
                    vs.append(torch.full_like(self.values[s][t], 1e4))
                    slots.append(-1)
            if not slots:
                continue
            order = torch.randperm(len(slots), generator=gen).tolist()
            store_kv_cache(torch.stack([ks[j] for j in order]),
                           torch.stack([vs[j] for j in order]),
                           self.key_cache, self.value_cache,
                           torch.tensor([slots[j] for j in order], dtype=torch.int64))

    def slot(self, s, t):
        return int(self.block_tables[s, t // self.block_size]) * self.block_size \
            + t % self.block_size


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_store_kv_cache_writes_exact_slots_and_skips_padding(block_size):
    seq_lens = [1, block_size - 1, block_size + 1, 40]
    st = PagedSetup(seq_lens, 4, 2, 8, block_size, seed=0)
    flat_k = st.key_cache.view(-1, 2, 8)
    flat_v = st.value_cache.view(-1, 2, 8)
    written = set()
    for s, n in enumerate(seq_lens):
        for t in range(n):
            slot = st.slot(s, t)
            written.add(slot)
            assert torch.equal(flat_k[slot], st.keys[s][t])
            assert torch.equal(flat_v[slot], st.values[s][t])
    untouched = [i for i in range(flat_k.shape[0]) if i not in written]
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()
    assert len(written) == sum(seq_lens)


def test_gather_kv_reads_back_a_sequence():
    st = PagedSetup([37, 5], 2, 2, 4, 16, seed=1)
    k, v = gather_kv(st.key_cache, st.value_cache, st.block_tables[0], 37)
    assert torch.equal(k, st.keys[0]) and torch.equal(v, st.values[0])
    k, v = gather_kv(st.key_cache, st.value_cache, st.block_tables[1].long(), 5)
    assert torch.equal(k, st.keys[1]) and torch.equal(v, st.values[1])


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_heads,num_kv_heads", HEADS)
def test_paged_attention_decode_matches_dense(num_heads, num_kv_heads, head_dim, block_size):
    seq_lens = [1, block_size - 1, block_size + 1, 100]
    st = PagedSetup(seq_lens, num_heads, num_kv_heads, head_dim, block_size,
                    seed=num_heads * 1000 + head_dim + block_size)
    gen = torch.Generator().manual_seed(7)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    scale = head_dim ** -0.5
    out = paged_attention_decode(query, st.key_cache, st.value_cache, st.block_tables,
                                 torch.tensor(seq_lens), scale)
    assert out.shape == query.shape and out.dtype == query.dtype
    for s, n in enumerate(seq_lens):
        ref = naive_attention(query[s : s + 1], st.keys[s], st.values[s], n - 1, scale)
        torch.testing.assert_close(out[s : s + 1].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_heads,num_kv_heads", HEADS)
def test_prefill_attention_chunks_over_cached_prefix(num_heads, num_kv_heads, head_dim,
                                                     block_size):
    bs = block_size
    # (cached prefix, query chunk) per sequence; totals 1, bs-1, bs+1, 100, 100, and an empty
    # chunk (a sequence scheduled with no new tokens).
    plan = [(0, 1), (0, bs - 1), (5, bs - 4), (37, 63), (99, 1), (0, 100), (3, 0)]
    seq_lens = [p + q for p, q in plan]
    # The prefix is stored by an earlier call, the chunk by a later one.
    chunks = [[(0, p), (p, p + q)] for p, q in plan]
    st = PagedSetup(seq_lens, num_heads, num_kv_heads, head_dim, bs,
                    seed=num_heads * 77 + head_dim + bs, store_in_chunks=chunks)
    gen = torch.Generator().manual_seed(11)
    q_lens = [q for _, q in plan]
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    qsl = torch.tensor([0] + q_lens).cumsum(0)
    scale = 0.3
    out = prefill_attention(query, st.key_cache, st.value_cache, qsl, torch.tensor(seq_lens),
                            st.block_tables, scale)
    assert out.shape == query.shape
    for s, (p, q) in enumerate(plan):
        if q == 0:
            continue
        a, b = int(qsl[s]), int(qsl[s + 1])
        ref = naive_attention(query[a:b], st.keys[s], st.values[s], p, scale)
        torch.testing.assert_close(out[a:b].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 3e-3)])
def test_paged_attention_half_precision(dtype, tol):
    seq_lens = [1, 15, 17, 100]
    st = PagedSetup(seq_lens, 8, 2, 64, 16, seed=3, dtype=dtype)
    query = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = paged_attention_decode(query, st.key_cache, st.value_cache, st.block_tables,
                                 torch.tensor(seq_lens), 0.125)
    assert out.dtype == dtype
    for s, n in enumerate(seq_lens):
        ref = naive_attention(query[s : s + 1], st.keys[s], st.values[s], n - 1, 0.125)
        torch.testing.assert_close(out[s : s + 1].double(), ref, atol=tol, rtol=tol)


def rms_reference(x, w, eps):
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("hidden", [8, 64, 576])
def test_rms_norm_matches_formula(hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(7, hidden, generator=gen) * 3
    w = torch.randn(hidden, generator=gen)
    out = rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), rms_reference(x, w, 1e-6), atol=1e-5, rtol=1e-5)
    # eps matters for tiny inputs
    small = torch.full((1, hidden), 1e-3)
    torch.testing.assert_close(rms_norm(small, w, 1e-2).double(),
                               rms_reference(small, w, 1e-2), atol=1e-6, rtol=1e-5)


def test_fused_add_rms_norm_returns_sum_as_residual():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 96, generator=gen)
    res = torch.randn(6, 96, generator=gen)
    w = torch.rand(96, generator=gen) + 0.5
    x0, res0 = x.clone(), res.clone()
    normed, new_res = fused_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(new_res, x0 + res0)
    torch.testing.assert_close(normed.double(), rms_reference(x0 + res0, w, 1e-5),
                               atol=1e-5, rtol=1e-5)


def rope_reference(positions, x, theta, head_dim):
    """Rotate pairs (i, i + d/2) as complex numbers by ``pos * theta^(-2i/d)``."""
    half = head_dim // 2
    x64 = x.double()
    z = torch.complex(x64[..., :half], x64[..., half:])  # [T, H, d/2]
    inv_freq = torch.tensor([theta ** (-2.0 * i / head_dim) for i in range(half)],
                            dtype=torch.float64)
    angle = positions.double()[:, None] * inv_freq[None, :]  # [T, d/2]
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads", [(32, 4, 4), (64, 8, 2),
                                                             (128, 6, 2)])
def test_apply_rope_matches_complex_rotation(head_dim, num_heads, num_kv_heads):
    theta, max_pos = 10000.0, 4096
    gen = torch.Generator().manual_seed(head_dim)
    half = head_dim // 2
    # The cache as a model builds it (fp32): cos in the first half, sin in the second.
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()
    assert cache.shape == (max_pos, head_dim) and half == inv.numel()
    positions = torch.tensor([0, 1, 2, 17, 1000, 4095, 5, 5])
    q = torch.randn(len(positions), num_heads, head_dim, generator=gen)
    k = torch.randn(len(positions), num_kv_heads, head_dim, generator=gen)
    q0, k0 = q.clone(), k.clone()
    rq, rk = apply_rope(positions, q, k, cache)
    assert rq.shape == q.shape and rk.shape == k.shape and rq.dtype == q.dtype
    torch.testing.assert_close(rq.double(), rope_reference(positions, q0, theta, head_dim),
                               atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(rk.double(), rope_reference(positions, k0, theta, head_dim),
                               atol=2e-5, rtol=1e-5)
    # Position 0 is the identity; rotation preserves each pair's norm.
    assert torch.equal(rq[0], q0[0])
    def pair_norms(t):
        return t[..., :half] ** 2 + t[..., half:] ** 2

    torch.testing.assert_close(pair_norms(rq), pair_norms(q0), atol=1e-4, rtol=1e-5)
