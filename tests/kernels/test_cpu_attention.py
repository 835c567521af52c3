"""The C++ CPU attention / KV-store / RMSNorm / rotary / SiLU kernels (``localchat.kernels.cpu``)
against the PyTorch references (``localchat.kernels.reference``).

Every ISA path runs (``avx512``, ``avx2``, ``scalar``; a path wider than the CPU runs clamped to
the widest it has, so each case runs on every CPU kind). Bounds, per op:

- ``paged_attention_decode``: against the reference on the fp32-upcast inputs. Both sides
  accumulate in fp32 over ``n`` tokens and ``D`` dims; the scores' error (``<= gamma_D`` of
  ``|q||k|``) moves the softmax weights by at most that much relatively, and the weighted sum
  of values is within ``gamma_n`` of ``max|v|`` (Higham, *Accuracy and Stability*, 3.1), so
  ``|out - ref| <= 4 (n + D) 2**-24 (1 + max|score|) max|v|``; a 16-bit output adds one
  rounding, the unit roundoff ``2**-8`` (bf16) / ``2**-11`` (fp16) of ``|ref|``. The kernel's polynomial
  ``exp`` (about 2 ulp) is far inside that. Odd lengths, block boundaries, the 128-token
  partitions' edges, ``seq_lens`` 1..2000, GQA ratios 1/3/4/5/8, head_dim 32/64/80/128/256 (the
  unrolled and the runtime-width paths), fp32/bf16/fp16 caches.
  On CPUs with AVX512_BF16 the avx512 level scores bf16 queries against bf16 keys with
  ``vdpbf16ps`` (``attn_dot.cpp``): the same products, exact in fp32, summed in fp32 over
  ``D`` terms, so the same bound holds; the decode and verify cases run both that path and
  the fp32-FMA one (``bf16_dot=False``), and where the CPU has the instruction the two must
  differ in some bits (else the dispatch did not take it).
- Batch invariance: a sequence's output alone equals its output in a batch bit for bit, and
  one thread equals two.
- ``store_kv_cache``: equal to the reference bit for bit (a copy), ``-1`` slots skipped; fp32
  keys into a 16-bit cache (an fp32 engine's default fp16 cache) rounded as ``Tensor.to``.
- An fp32 query over fp16 / bf16 caches: the fp32 kernel over the widened caches, bit for
  bit, decode and verify, every task kind and ISA.
- ``apply_rope``: the same IEEE operations as the reference (no FMA contraction), so equal bit
  for bit in every dtype.
- ``rms_norm`` / ``fused_add_rms_norm``: the residual sum equals the reference bit for bit
  (one rounding of an exact sum); the norm differs by the sum of squares' order, within
  ``2 (H + 4) 2**-24`` of ``|ref|`` in fp32; in 16 bits the normalized value may round to
  the neighbouring value (one ulp, two unit roundoffs) before the weight's product rounds
  again: four unit roundoffs of ``|ref|``.
- ``silu_and_mul``: ``exp`` implementations differ by ulps: ``16 * 2**-24`` of ``|ref|`` in
  fp32; in 16 bits the rounded SiLU may differ by one ulp before the product: four unit
  roundoffs of ``|ref|``.
- Dispatch: ``localchat.kernels.<op>`` runs the C++ kernel for CPU tensors (its result equals
  the kernel's bit for bit), ``silu_and_mul`` included.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu, reference

ISAS = ["avx512", "avx2", "scalar"]
# (ISA level, bf16_dot): the avx512 level with and without the vdpbf16ps scores
DECODE_PATHS = [("avx512", True), ("avx512", False), ("avx2", True), ("scalar", True)]
DECODE_PATH_IDS = ["avx512", "avx512-fma", "avx2", "scalar"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HAVE_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None
ROUND = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.fixture(scope="module")
def built():
    ok = cpu.available()
    assert ok == HAVE_COMPILER, "a C++ compiler is present but the CPU kernels did not build"
    if not ok:
        pytest.skip("no C++ compiler: the CPU kernels cannot be built here")
    return ok


def paged_case(seq_lens, heads, kv_heads, head_dim, dtype, block_size=16, seed=0):
    """Random caches and shuffled block tables for ``seq_lens``; returns the op's arguments."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim,
                              generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_per_seq) + 1
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        block_tables[i, :nb] = perm[used:used + nb].int()
        used += nb
    query = torch.randn(len(seq_lens), heads, head_dim, generator=gen).to(dtype)
    return query, key_cache, value_cache, block_tables, torch.tensor(seq_lens)


def assert_decode_close(out, query, key_cache, value_cache, block_tables, seq_lens, scale):
    ref = reference.paged_attention_decode(query.float(), key_cache.float(), value_cache.float(),
                                           block_tables, seq_lens, scale)
    assert out.shape == ref.shape and out.dtype == query.dtype
    d = query.shape[-1]
    for i, n in enumerate(seq_lens.tolist()):
        k, v = reference.gather_kv(key_cache.float(), value_cache.float(), block_tables[i], n)
        group = query.shape[1] // k.shape[1]
        scores = torch.einsum("hgd,thd->hgt", query[i].float().double().view(k.shape[1], group, d),
                              k.double()) * scale
        bound = 4 * (n + d) * 2.0**-24 * (1 + scores.abs().max().item()) * v.abs().max().item()
        err = (out[i].float() - ref[i]).abs()
        limit = bound + ROUND[query.dtype] * ref[i].abs()
        assert bool((err <= limit).all()), (
            f"seq {i} (len {n}): max err {err.max():.3g}, bound {bound:.3g}")


# Both decode task kinds (attn_kernels.h): queries and accumulators in registers where
# 2 * G * head_dim / lanes fits kRegBudget (AVX-512: (9, 3, 64), (8, 8, 64), (4, 4, 32);
# AVX2: (4, 4, 32)), the per-head sweep elsewhere.
DECODE_SHAPES = [(9, 3, 64), (8, 8, 64), (16, 2, 64), (12, 4, 128), (14, 2, 128), (10, 2, 80),
                 (4, 1, 256), (4, 4, 32)]


@pytest.mark.parametrize("isa,bf16_dot", DECODE_PATHS, ids=DECODE_PATH_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", DECODE_SHAPES)
def test_paged_decode_matches_reference(built, monkeypatch, isa, bf16_dot, dtype, heads,
                                        kv_heads, head_dim):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    # lengths around the 16-token blocks and softmax chunks, and the 128-token partitions
    lens = [1, 15, 16, 17, 31, 32, 33, 100, 128, 129, 256, 257, 517]
    args = paged_case(lens, heads, kv_heads, head_dim, dtype, seed=heads * head_dim)
    scale = head_dim**-0.5
    out = cpu.paged_attention_decode(*args, scale, bf16_dot=bf16_dot)
    assert_decode_close(out, *args, scale)
    if bf16_dot:  # the dispatch (localchat.kernels) runs this path
        assert torch.equal(kernels.paged_attention_decode(*args, scale), out)


def test_paged_decode_takes_the_bf16_dot_where_the_cpu_has_it(built, monkeypatch):
    monkeypatch.setenv(cpu.ISA_ENV, "avx512")
    has_dot = cpu.best_isa() == 2 and bool(cpu._ops().has_bf16_dot())
    differing = 0
    for seed in range(16):
        for heads, kv_heads, head_dim in [(9, 3, 64), (12, 2, 128)]:
            args = paged_case([517, 33, 200, 1000], heads, kv_heads, head_dim, torch.bfloat16,
                              seed=seed)
            dot = cpu.paged_attention_decode(*args, 0.1)
            fma = cpu.paged_attention_decode(*args, 0.1, bf16_dot=False)
            differing += int((dot != fma).sum())
    # The two sum the scores' products in different orders (and scale them at a different
    # point), so a few bf16 outputs of these cases round differently: 0-4 per case measured
    # here (~0.05%), none in 3 cases of 10; where the CPU has no vdpbf16ps the same code runs
    # and every bit is equal.
    assert (differing > 0) == has_dot, differing


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block_size", [16, 32, 5])
def test_paged_decode_long_and_block_sizes(built, monkeypatch, isa, block_size):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    args = paged_case([2000, 1, 777], 9, 3, 64, torch.float32, block_size=block_size, seed=3)
    out = cpu.paged_attention_decode(*args, 0.125)
    assert_decode_close(out, *args, 0.125)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_decode_batch_and_thread_invariant(built, dtype):
    query, kc, vc, bt, sl = paged_case([5, 300, 64, 1999], 12, 4, 64, dtype, seed=7)
    batched = cpu.paged_attention_decode(query, kc, vc, bt, sl, 0.125)
    for i in range(len(sl)):
        alone = cpu.paged_attention_decode(query[i:i + 1], kc, vc, bt[i:i + 1], sl[i:i + 1],
                                           0.125)
        assert torch.equal(alone[0], batched[i])
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu.paged_attention_decode(query, kc, vc, bt, sl, 0.125)
        torch.set_num_threads(2)
        two = cpu.paged_attention_decode(query, kc, vc, bt, sl, 0.125)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, batched) and torch.equal(two, batched)


CACHE16 = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache_dtype", CACHE16, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", DECODE_SHAPES)
def test_fp32_query_over_16bit_cache_is_the_fp32_kernel_on_widened_caches(
        built, monkeypatch, isa, cache_dtype, heads, kv_heads, head_dim):
    """An fp32 engine's 16-bit KV cache: the decode (and verify) over fp16 / bf16 caches with
    an fp32 query equals the fp32 kernel over the caches widened to fp32, bit for bit (the
    widening is exact and the arithmetic is the fp32 kernel's), for every task kind (the
    shapes pick registers, the blocked task and the sweep) and ISA; the reference agrees."""
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    seq_lens = [1, 17, 130, 300]
    query, kc, vc, bt, sl = paged_case(seq_lens, heads, kv_heads, head_dim, cache_dtype,
                                       seed=head_dim + heads)
    query = query.float()
    scale = head_dim**-0.5
    out = cpu.paged_attention_decode(query, kc, vc, bt, sl, scale)
    assert out.dtype == torch.float32
    want = cpu.paged_attention_decode(query, kc.float(), vc.float(), bt, sl, scale)
    assert torch.equal(out, want)
    assert torch.equal(kernels.paged_attention_decode(query, kc, vc, bt, sl, scale), out)
    ref = reference.paged_attention_decode(query, kc, vc, bt, sl, scale)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    (vq, vkc, vvc, qsl, vsl, vbt), dec = verify_case([40, 130], [5, 5], heads, kv_heads,
                                                     head_dim, cache_dtype, seed=heads)
    vq = vq.float()
    got = cpu.paged_attention_verify(vq, vkc, vvc, qsl, vsl, vbt, scale)
    assert torch.equal(got, cpu.paged_attention_verify(vq, vkc.float(), vvc.float(), qsl, vsl,
                                                       vbt, scale))


def test_mixed_dtypes_the_kernels_refuse(built):
    query, kc, vc, bt, sl = paged_case([20], 9, 3, 64, torch.float16)
    with pytest.raises(RuntimeError, match="fp16 / bf16 under an fp32 query"):
        cpu.paged_attention_decode(query.bfloat16(), kc, vc, bt, sl, 0.1)  # bf16 over fp16
    with pytest.raises(RuntimeError, match="fp16 / bf16 under an fp32 query"):
        cpu.paged_attention_decode(query.float(), kc, vc.bfloat16(), bt, sl, 0.1)
    # a 16-bit query over an fp32 cache is no kernel's: the dispatch takes the reference
    q16, k32, v32 = query, kc.float(), vc.float()
    assert torch.equal(kernels.paged_attention_decode(q16, k32, v32, bt, sl, 0.1),
                       reference.paged_attention_decode(q16, k32, v32, bt, sl, 0.1))


def test_paged_decode_rejects_bad_inputs(built):
    query, kc, vc, bt, sl = paged_case([20], 9, 3, 64, torch.float32)
    with pytest.raises(RuntimeError, match="exceeds its block table"):
        cpu.paged_attention_decode(query, kc, vc, bt, torch.tensor([16 * bt.shape[1] + 1]), 0.1)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu.paged_attention_decode(query[..., :40], kc[..., :40], vc[..., :40], bt, sl, 0.1)


def verify_case(seq_lens, q_lens, heads, kv_heads, head_dim, dtype, seed=0):
    """A ``prefill_attention`` case (the last ``q_lens[i]`` of ``seq_lens[i]`` tokens are
    queries) and its expansion into one decode row per query token: ``(args, decode_args)``."""
    _, kc, vc, bt, sl = paged_case(seq_lens, heads, kv_heads, head_dim, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    query = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0] + q_lens).cumsum(0)
    rows = [i for i, n in enumerate(q_lens) for _ in range(n)]
    lens = [seq_lens[i] - q_lens[i] + j + 1 for i, n in enumerate(q_lens) for j in range(n)]
    decode_args = (query, kc, vc, bt[rows], torch.tensor(lens))
    return (query, kc, vc, qsl, sl, bt), decode_args


@pytest.mark.parametrize("isa,bf16_dot", DECODE_PATHS, ids=DECODE_PATH_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (12, 2, 128)])
def test_paged_verify_is_decode_per_row_and_matches_prefill(built, monkeypatch, isa, bf16_dot,
                                                            dtype, heads, kv_heads, head_dim):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    # drafts of 5 over short and partitioned contexts, a 1-token row, a 16-token chunk, a
    # sequence without query tokens, a whole sequence as the chunk
    seq_lens, q_lens = [5, 40, 130, 300, 1, 16, 77], [5, 5, 5, 5, 1, 16, 0]
    (query, kc, vc, qsl, sl, bt), dec = verify_case(seq_lens, q_lens, heads, kv_heads,
                                                    head_dim, dtype, seed=head_dim)
    scale = head_dim**-0.5
    out = cpu.paged_attention_verify(query, kc, vc, qsl, sl, bt, scale, bf16_dot=bf16_dot)
    # each row is the decode step at its position, bit for bit
    assert torch.equal(out, cpu.paged_attention_decode(*dec, scale, bf16_dot=bf16_dot))
    assert_decode_close(out, *dec, scale)
    # and the expansion is the prefill contract: the reference prefill agrees with the
    # reference decode over the expanded rows (fp32, same formula, only summation order)
    want = reference.prefill_attention(query.float(), kc.float(), vc.float(), qsl, sl, bt, scale)
    dec32 = (dec[0].float(), dec[1].float(), dec[2].float(), dec[3], dec[4])
    assert torch.allclose(reference.paged_attention_decode(*dec32, scale), want, atol=1e-5)


def test_paged_verify_dispatch_and_bad_inputs(built):
    (query, kc, vc, qsl, sl, bt), _ = verify_case([40, 9], [5, 3], 9, 3, 64, torch.float32)
    got = kernels.prefill_attention(query, kc, vc, qsl, sl, bt, 0.125, max_query_len=5)
    assert torch.equal(got, cpu.paged_attention_verify(query, kc, vc, qsl, sl, bt, 0.125))
    # no host-side bound, or a chunk longer than CPU_VERIFY_MAX_QUERY: the reference (SDPA)
    want = reference.prefill_attention(query, kc, vc, qsl, sl, bt, 0.125)
    assert torch.equal(kernels.prefill_attention(query, kc, vc, qsl, sl, bt, 0.125), want)
    with pytest.raises(RuntimeError, match="query_start_loc must run from 0"):
        cpu.paged_attention_verify(query, kc, vc, qsl + 1, sl, bt, 0.125)
    with pytest.raises(RuntimeError, match="query tokens of seq_lens"):
        cpu.paged_attention_verify(query, kc, vc, qsl, torch.tensor([40, 2]), bt, 0.125)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_store_kv_cache_equals_reference(built, dtype):
    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(6, 16, 3, 64, generator=gen).to(dtype)
    vc = torch.randn(6, 16, 3, 64, generator=gen).to(dtype)
    # key as the model passes it: a view of a fused projection (strided rows)
    qkv = torch.randn(7, 3 * 3 * 64, generator=gen).to(dtype)
    key = qkv[:, 64 * 3:64 * 6].view(7, 3, 64)
    value = qkv[:, 64 * 6:].view(7, 3, 64)
    slots = torch.tensor([0, 15, 16, -1, 95, 40, -1])
    want_k, want_v = kc.clone(), vc.clone()
    reference.store_kv_cache(key, value, want_k, want_v, slots)
    kernels.store_kv_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu.store_kv_cache(key, value, kc, vc, torch.tensor([0, 1, 2, 3, 4, 5, 96]))


@pytest.mark.parametrize("cache_dtype", CACHE16, ids=str)
def test_store_kv_cache_rounds_fp32_keys_into_a_16bit_cache(built, cache_dtype):
    """An fp32 engine's 16-bit cache: the stored rows are the keys rounded to the cache's
    type to nearest even (``Tensor.to``), as the reference stores them."""
    gen = torch.Generator().manual_seed(2)
    kc = torch.zeros(4, 16, 2, 64, dtype=cache_dtype)
    vc = torch.zeros(4, 16, 2, 64, dtype=cache_dtype)
    qkv = torch.randn(5, 6 * 64, generator=gen) * 300  # fp16 steps of 0.25 at this size
    key, value = qkv[:, 128:256].view(5, 2, 64), qkv[:, 256:].view(5, 2, 64)
    slots = torch.tensor([3, -1, 16, 63, 0])
    want_k, want_v = kc.clone(), vc.clone()
    reference.store_kv_cache(key, value, want_k, want_v, slots)
    kernels.store_kv_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert torch.equal(kc.view(-1, 2, 64)[16], key[2].to(cache_dtype))
    with pytest.raises(RuntimeError, match="must share a dtype"):
        cpu.store_kv_cache(key, value.half(), kc, vc, slots)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(1, 9, 3, 64), (13, 14, 2, 64),
                                                            (5, 12, 2, 128), (3, 4, 4, 32)])
def test_rope_equals_reference(built, monkeypatch, isa, dtype, tokens, heads, kv_heads,
                               head_dim):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    from localchat.engine.layers.rotary import RotaryEmbedding

    cache = RotaryEmbedding(head_dim, 4096, 10000.0).cos_sin_cache
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q = qkv[:, :heads * head_dim].reshape(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].reshape(tokens, kv_heads,
                                                                        head_dim)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    want_q, want_k = reference.apply_rope(positions, q, k, cache)
    got_q, got_k = kernels.apply_rope(positions, q, k, cache)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def norm_tol(dtype, hidden):
    return 2 * (hidden + 4) * 2.0**-24 if dtype == torch.float32 else 4 * ROUND[dtype]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 896), (3, 100), (2, 64), (17, 1536)])
def test_rms_norms_match_reference(built, monkeypatch, isa, dtype, rows, hidden):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    gen = torch.Generator().manual_seed(rows * hidden)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype)
    res = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    tol = norm_tol(dtype, hidden)

    def close(got, want):
        assert got.dtype == want.dtype and got.shape == want.shape
        err = (got.float() - want.float()).abs()
        assert bool((err <= tol * want.float().abs() + 1e-30).all()), err.max()

    close(kernels.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5))
    got_n, got_r = kernels.fused_add_rms_norm(x, res, w, 1e-6)
    want_n, want_r = reference.fused_add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(got_r, want_r)
    close(got_n, want_n)
    # per-head q/k norm of Qwen3: [T, H, D] rows of a strided view
    qk = x.view(rows, -1)[:, : (hidden // 64) * 64].reshape(rows, -1, 64)[:, ::2]
    w64 = w[:64].contiguous()
    tol = norm_tol(dtype, 64)
    close(kernels.rms_norm(qk, w64, 1e-6), reference.rms_norm(qk, w64, 1e-6))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 4864), (3, 7), (2, 1100), (1, 8960)])
def test_silu_and_mul_matches_reference(built, monkeypatch, isa, dtype, rows, inter):
    monkeypatch.setenv(cpu.ISA_ENV, isa)
    gen = torch.Generator().manual_seed(inter)
    x = torch.randn(rows, 2 * inter, generator=gen) * 4
    x[:, :4] = torch.tensor([-100.0, -87.0, 60.0, 100.0])  # the exp's clamped range edges
    x = x.to(dtype)
    got, want = cpu.silu_and_mul(x), reference.silu_and_mul(x)
    assert got.dtype == want.dtype and got.shape == want.shape == (rows, inter)
    tol = 16 * 2.0**-24 if dtype == torch.float32 else 4 * ROUND[dtype]
    err = (got.float() - want.float()).abs()
    assert bool((err <= tol * want.float().abs() + 1e-30).all()), err.max()


def test_dispatch_runs_the_cpu_kernels(built):
    args = paged_case([40, 3], 9, 3, 64, torch.float32)
    assert torch.equal(kernels.paged_attention_decode(*args, 0.125),
                       cpu.paged_attention_decode(*args, 0.125))
    x = torch.randn(3, 2 * 96)
    w = torch.randn(96)
    assert torch.equal(kernels.rms_norm(x[:, :96], w, 1e-6), cpu.rms_norm(x[:, :96], w, 1e-6))
    for dtype in DTYPES:
        g = x.to(dtype)
        assert torch.equal(kernels.silu_and_mul(g), cpu.silu_and_mul(g))
