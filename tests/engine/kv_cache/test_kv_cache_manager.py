"""KVCacheManager and the KV cache sizing helpers.

References: ``ceil(tokens / block_size)`` blocks per request computed here; the KV byte
formula ``2 x num_layers x num_kv_heads x head_dim x dtype_bytes``; and, for the property test,
a model of which blocks each request must hold, checked after every operation (held + free ==
num_blocks, no block id held twice, ref counts consistent, ``request.block_ids`` mirrors the
manager).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.kv_cache import KVCacheManager, allocate_kv_caches
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams


def make_request(rid: str, num_prompt: int) -> Request:
    return Request(rid, list(range(num_prompt)), SamplingParams(temperature=0.0), max_tokens=8)


def check_integrity(mgr: KVCacheManager, requests: list[Request]) -> None:
    pool = mgr.block_pool
    held = [b for blocks in mgr._blocks.values() for b in blocks]
    held_ids = [b.block_id for b in held]
    free_ids = pool.free_block_ids
    assert len(held_ids) == len(set(held_ids)), "a block id is held twice"
    assert len(free_ids) == len(set(free_ids))
    assert not set(held_ids) & set(free_ids)
    assert len(held_ids) + len(free_ids) == pool.num_blocks
    for b in pool.blocks:
        assert b.ref_cnt == held_ids.count(b.block_id)
    for r in requests:
        blocks = mgr._blocks.get(r.request_id, [])
        assert r.block_ids == [b.block_id for b in blocks]
    assert mgr.usage == pytest.approx(len(held_ids) / pool.num_blocks)


@pytest.mark.parametrize("num_tokens,blocks", [(1, 1), (15, 1), (16, 1), (17, 2), (32, 2),
                                               (33, 3)])
def test_blocks_at_boundaries(num_tokens, blocks):
    mgr = KVCacheManager(num_blocks=8, block_size=16)
    req = make_request("a", num_tokens)
    assert mgr.num_blocks_needed(num_tokens) == blocks
    assert mgr.allocate_slots(req, num_tokens)
    assert len(req.block_ids) == blocks
    assert mgr.block_pool.num_free_blocks == 8 - blocks
    check_integrity(mgr, [req])


def test_growth_one_token_at_a_time():
    """Decoding adds a block exactly when token 17 (33, ...) arrives."""
    mgr = KVCacheManager(num_blocks=4, block_size=16)
    req = make_request("a", 15)
    assert mgr.allocate_slots(req, 15)
    counts = []
    req.num_computed_tokens = 15
    for _ in range(20):
        assert mgr.allocate_slots(req, 1)
        counts.append(len(req.block_ids))
        req.num_computed_tokens += 1
        check_integrity(mgr, [req])
    # tokens 16..35: 16 -> 1 block, 17..32 -> 2, 33..35 -> 3
    assert counts == [1] + [2] * 16 + [3] * 3


def test_chunks_allocate_on_top_of_computed_tokens():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", 10)
    assert mgr.allocate_slots(req, 3)
    assert len(req.block_ids) == 1
    req.num_computed_tokens = 3
    assert mgr.allocate_slots(req, 6)  # 9 tokens -> 3 blocks
    assert len(req.block_ids) == 3
    req.num_computed_tokens = 9
    assert mgr.allocate_slots(req, 1)  # 10 -> 3 blocks
    assert len(req.block_ids) == 3
    check_integrity(mgr, [req])


def test_refusal_leaves_state_unchanged():
    mgr = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request("a", 8), make_request("b", 9)
    assert mgr.allocate_slots(a, 8)  # 2 blocks
    free_before = mgr.block_pool.free_block_ids
    assert not mgr.allocate_slots(b, 9)  # needs 3, 1 free
    assert b.block_ids == []
    assert mgr.block_pool.free_block_ids == free_before
    assert a.block_ids == [0, 1]
    # A request that already holds blocks and is refused more keeps what it had.
    a.num_computed_tokens = 8
    assert not mgr.allocate_slots(a, 8)  # 16 tokens -> 4 blocks, has 2, 1 free
    assert a.block_ids == [0, 1]
    check_integrity(mgr, [a, b])
    assert mgr.allocate_slots(b, 4)
    assert b.block_ids == [2]
    check_integrity(mgr, [a, b])


def test_free_returns_blocks_and_clears_block_ids():
    mgr = KVCacheManager(num_blocks=4, block_size=4)
    a, b = make_request("a", 5), make_request("b", 7)
    assert mgr.allocate_slots(a, 5) and mgr.allocate_slots(b, 7)
    assert mgr.usage == 1.0
    mgr.free(a)
    assert a.block_ids == [] and mgr.usage == 0.5
    check_integrity(mgr, [a, b])
    mgr.free(b)
    assert mgr.usage == 0.0 and mgr.block_pool.num_free_blocks == 4
    # Tail-first free: b's blocks [2, 3] come back as 3, 2 after a's 1, 0.
    assert mgr.block_pool.free_block_ids == [1, 0, 3, 2]
    check_integrity(mgr, [a, b])
    # Freeing a request that holds nothing is harmless.
    mgr.free(a)
    check_integrity(mgr, [a, b])


def test_allocate_kv_caches_shapes():
    """One distinct ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensor per layer
    (their bytes against ``memory.footprint.kv_bytes``: tests/engine/memory/test_planner.py)."""
    caches = allocate_kv_caches(3, 5, 16, 2, 8, torch.float16, torch.device("cpu"))
    assert len(caches) == 3
    assert len({c.data_ptr() for c in caches}) == 3
    for c in caches:
        assert c.shape == (2, 5, 16, 2, 8) and c.dtype == torch.float16


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "alloc", "free"]), st.integers(0, 5),
              st.integers(0, 40)),
    min_size=1, max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 4, 16]), ops=ops)
def test_random_operations_keep_integrity(num_blocks, block_size, ops):
    mgr = KVCacheManager(num_blocks, block_size)
    reqs = [make_request(f"r{i}", 1) for i in range(6)]
    for op, i, n in ops:
        req = reqs[i]
        if op == "free":
            mgr.free(req)
            req.num_computed_tokens = 0
        else:
            held_before = list(req.block_ids)
            free_before = mgr.block_pool.num_free_blocks
            need = math.ceil((req.num_computed_tokens + n) / block_size)
            extra = max(0, need - len(held_before))
            ok = mgr.allocate_slots(req, n)
            assert ok == (extra <= free_before)
            if ok:
                assert len(req.block_ids) == max(need, len(held_before))
                assert req.block_ids[: len(held_before)] == held_before
                assert mgr.block_pool.num_free_blocks == free_before - extra
                # Half the time the tokens are "computed" (a prefill chunk ran).
                if n % 2 == 0:
                    req.num_computed_tokens += n
            else:
                assert req.block_ids == held_before
                assert mgr.block_pool.num_free_blocks == free_before
        check_integrity(mgr, reqs)
    for r in reqs:
        mgr.free(r)
    assert mgr.block_pool.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in mgr.block_pool.blocks)
    check_integrity(mgr, reqs)
