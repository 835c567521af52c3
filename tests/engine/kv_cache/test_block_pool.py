"""BlockPool: exact scenarios on tiny pools plus a stateful model check.

Reference: a plain Python model of the pool (a deque of free ids, least recently freed first,
and a dict of ref counts) kept beside the real pool; after every operation the two must agree
and the integrity invariants must hold (held + free == num_blocks, no block both free and
held, ref counts consistent).
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from localchat.engine.kv_cache import BlockPool, KVCacheBlock


def free_ids(pool: BlockPool) -> list[int]:
    return pool.free_block_ids


def check_integrity(pool: BlockPool) -> None:
    free = free_ids(pool)
    assert len(free) == len(set(free)), "a block is twice in the free queue"
    assert pool.num_free_blocks == len(free)
    held = [b.block_id for b in pool.blocks if b.ref_cnt > 0]
    assert not set(held) & set(free), "a block is both held and free"
    assert len(held) + len(free) == pool.num_blocks
    assert all(b.ref_cnt >= 0 for b in pool.blocks)
    assert all(pool.blocks[i].block_id == i for i in range(pool.num_blocks))
    assert pool.usage == pytest.approx(len(held) / pool.num_blocks)


def test_fresh_pool_all_free_in_id_order():
    pool = BlockPool(4)
    assert pool.num_free_blocks == 4
    assert pool.usage == 0.0
    assert [b.block_id for b in pool.allocate(4)] == [0, 1, 2, 3]
    assert pool.usage == 1.0
    check_integrity(pool)


@pytest.mark.parametrize("n", [0, -1])
def test_bad_num_blocks(n):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(n)


def test_allocate_sets_ref_count_and_clears_hash():
    pool = BlockPool(3)
    pool.blocks[0].block_hash = 1234
    (b,) = pool.allocate(1)
    assert b.block_id == 0 and b.ref_cnt == 1 and b.block_hash is None
    assert pool.num_free_blocks == 2
    assert pool.usage == pytest.approx(1 / 3)


def test_allocate_too_many_refuses_and_leaves_state_unchanged():
    pool = BlockPool(5)
    pool.allocate(3)
    before = (free_ids(pool), [b.ref_cnt for b in pool.blocks])
    with pytest.raises(ValueError, match="cannot allocate 3"):
        pool.allocate(3)
    assert (free_ids(pool), [b.ref_cnt for b in pool.blocks]) == before
    assert [b.block_id for b in pool.allocate(2)] == [3, 4]
    check_integrity(pool)


def test_free_returns_blocks_and_usage_drops():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert pool.usage == 0.75
    pool.free(a)
    assert pool.num_free_blocks == 4
    assert pool.usage == 0.0
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    check_integrity(pool)


def test_free_queue_is_lru_and_tail_first():
    """Freed blocks go to the back, the tail of each freed list first; allocation takes the
    least recently freed from the front."""
    pool = BlockPool(6)
    a = pool.allocate(2)  # 0 1
    b = pool.allocate(3)  # 2 3 4
    # free queue now: [5]
    pool.free(b)  # -> [5, 4, 3, 2]
    pool.free(a)  # -> [5, 4, 3, 2, 1, 0]
    assert free_ids(pool) == [5, 4, 3, 2, 1, 0]
    assert [x.block_id for x in pool.allocate(3)] == [5, 4, 3]
    assert [x.block_id for x in pool.allocate(3)] == [2, 1, 0]


def test_double_free_raises():
    pool = BlockPool(2)
    a = pool.allocate(1)
    pool.free(a)
    with pytest.raises(ValueError, match="double free of block 0"):
        pool.free(a)
    assert free_ids(pool) == [1, 0]
    check_integrity(pool)


def test_double_free_inside_a_list_leaves_state_unchanged():
    pool = BlockPool(4)
    a = pool.allocate(2)  # 0 1
    b = pool.allocate(1)  # 2
    pool.free(b)
    before = (free_ids(pool), [x.ref_cnt for x in pool.blocks])
    with pytest.raises(ValueError, match="double free"):
        pool.free([a[0], b[0], a[1]])
    assert (free_ids(pool), [x.ref_cnt for x in pool.blocks]) == before
    # The same block twice in one call with ref_cnt 1 is a double free as well.
    with pytest.raises(ValueError, match="double free"):
        pool.free([a[1], a[1]])
    assert (free_ids(pool), [x.ref_cnt for x in pool.blocks]) == before
    check_integrity(pool)


def test_shared_block_returns_only_when_last_reference_goes():
    """A block shared by two owners (ref_cnt 2, as prefix caching will do) stays held until
    both free it."""
    pool = BlockPool(3)
    (blk,) = pool.allocate(1)
    blk.ref_cnt += 1  # second owner
    pool.free([blk])
    assert blk.ref_cnt == 1 and pool.num_free_blocks == 2
    check_integrity(pool)
    pool.free([blk])
    assert blk.ref_cnt == 0 and pool.num_free_blocks == 3
    assert free_ids(pool)[-1] == blk.block_id
    check_integrity(pool)


def test_freed_block_keeps_hash_until_reused():
    pool = BlockPool(1)
    (blk,) = pool.allocate(1)
    blk.block_hash = 99
    pool.free([blk])
    assert blk.block_hash == 99
    (again,) = pool.allocate(1)
    assert again is blk and again.block_hash is None


def test_block_dataclass_defaults():
    b = KVCacheBlock(7)
    assert (b.block_id, b.ref_cnt, b.block_hash) == (7, 0, None)


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / free / share / double-free against a reference model."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: BlockPool | None = None

    @rule(num_blocks=st.integers(1, 12))
    def init(self, num_blocks):
        if self.pool is not None:
            return
        self.pool = BlockPool(num_blocks)
        self.model_free: deque[int] = deque(range(num_blocks))
        self.model_ref = [0] * num_blocks
        self.owners: list[list[KVCacheBlock]] = []

    @rule(n=st.integers(0, 14))
    def allocate(self, n):
        if self.pool is None:
            return
        if n > len(self.model_free):
            with pytest.raises(ValueError):
                self.pool.allocate(n)
            return
        got = self.pool.allocate(n)
        expected = [self.model_free.popleft() for _ in range(n)]
        assert [b.block_id for b in got] == expected
        for i in expected:
            self.model_ref[i] = 1
        self.owners.append(got)

    @rule(data=st.data())
    def free(self, data):
        if self.pool is None or not self.owners:
            return
        blocks = self.owners.pop(data.draw(st.integers(0, len(self.owners) - 1)))
        self.pool.free(blocks)
        for b in reversed(blocks):
            self.model_ref[b.block_id] -= 1
            if self.model_ref[b.block_id] == 0:
                self.model_free.append(b.block_id)

    @rule(data=st.data())
    def share(self, data):
        """Another owner takes a reference to part of a held list (prefix-cache style)."""
        if self.pool is None or not self.owners:
            return
        src = self.owners[data.draw(st.integers(0, len(self.owners) - 1))]
        if not src:
            return
        k = data.draw(st.integers(1, len(src)))
        for b in src[:k]:
            b.ref_cnt += 1
            self.model_ref[b.block_id] += 1
        self.owners.append(list(src[:k]))

    @rule(data=st.data())
    def double_free(self, data):
        if self.pool is None:
            return
        free_blocks = [self.pool.blocks[i] for i in self.model_free]
        if not free_blocks:
            return
        victim = data.draw(st.sampled_from(free_blocks))
        held = [b for owner in self.owners for b in owner][:3]
        pos = data.draw(st.integers(0, len(held)))
        with pytest.raises(ValueError, match="double free"):
            self.pool.free(held[:pos] + [victim] + held[pos:])

    @invariant()
    def agrees_with_model(self):
        if self.pool is None:
            return
        check_integrity(self.pool)
        assert free_ids(self.pool) == list(self.model_free)
        assert [b.ref_cnt for b in self.pool.blocks] == self.model_ref
        # Ref counts equal the number of owners holding each block.
        counts = [0] * self.pool.num_blocks
        for owner in self.owners:
            for b in owner:
                counts[b.block_id] += 1
        assert counts == self.model_ref


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
