"""The pool of fixed-size KV blocks with prefix caching (vLLM's ``BlockPool``; PagedAttention,
Kwon et al. 2023, arXiv 2309.06180; automatic prefix caching as in vLLM v1 / SGLang's radix
cache, reduced to a hash table over full blocks).

Every block is either in use (``ref_cnt > 0``, held by one or more requests that share a
prefix) or in the free queue. The free queue is ordered least recently freed first; a freed
block keeps its ``block_hash`` and stays findable in the hash table until ``allocate`` takes
it for new tokens (eviction). So the least recently used cached block is evicted first, and
because a request frees its blocks tail first, a sequence's tail is evicted before its head.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class KVCacheBlock:
    """One block of ``block_size`` token slots in every layer's cache.

    ``block_hash`` (set only when the block is full and cached) chains the parent block's hash
    with this block's ``token_ids`` (see ``kv_cache.manager.hash_block_tokens``); ``token_ids``
    are kept so that a hash hit can be verified token by token.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None
    # A fresh id each time the block is cached, and the one its parent block had when this
    # block was cached: a hit must follow the same chain of cached blocks, so even a collision
    # of chained hashes cannot pair a block with a prefix its K/V was not computed from.
    cache_id: int | None = None
    parent_cache_id: int | None = None


class BlockPool:
    """``num_blocks`` blocks, a free queue in LRU order and a ``block_hash -> block`` table.

    ``allocate(n)`` takes the ``n`` least recently freed blocks (evicting their cached
    contents), ``touch(blocks)`` takes shared ownership of cached blocks (removing free ones
    from the queue), ``free(blocks)`` drops one reference each, tail first.

    Raises ``ValueError`` when asked for more blocks than are free, or when freeing a block
    whose ref count is already zero (a double free).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # block_id -> block, least recently freed first.
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        self._cache_ids = itertools.count()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (next to be allocated first)."""
        return list(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_blocks

    def get_cached_block(self, block_hash: int, token_ids: tuple[int, ...],
                         parent: KVCacheBlock | None) -> KVCacheBlock | None:
        """The cached block for ``block_hash`` whose tokens are exactly ``token_ids`` and
        whose K/V was computed after ``parent`` (the previous cached block of the same prefix;
        ``None`` for the first block). Anything else, a hash collision included, is a miss."""
        block = self.cached_block_hash_to_block.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        expected_parent = None if parent is None else parent.cache_id
        if parent is not None and expected_parent is None:
            return None
        if block.parent_cache_id != expected_parent:
            return None
        return block

    def cache_block(self, block: KVCacheBlock, block_hash: int, token_ids: tuple[int, ...],
                    parent: KVCacheBlock | None) -> bool:
        """Record that full ``block`` holds ``token_ids`` after ``parent`` under ``block_hash``.

        Returns whether ``block`` is now the table's entry. If another block already caches
        this hash (two requests computed the same prefix at once), the first one stays and
        ``block`` stays unhashed; so does a block whose parent is not cached.
        """
        if block.block_hash is not None:
            return self.cached_block_hash_to_block.get(block.block_hash) is block
        if block_hash in self.cached_block_hash_to_block:
            return False
        if parent is not None and parent.cache_id is None:
            return False
        block.block_hash = block_hash
        block.token_ids = token_ids
        block.cache_id = next(self._cache_ids)
        block.parent_cache_id = None if parent is None else parent.cache_id
        self.cached_block_hash_to_block[block_hash] = block
        return True

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """``n`` fresh blocks with ``ref_cnt`` 1, evicting cached contents LRU first."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Add one reference to each of ``blocks`` (a prefix-cache hit), taking free ones out
        of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference to each of ``blocks`` (given in sequence order). Blocks that
        reach zero join the back of the free queue tail first, keeping their hash."""
        # Validate the whole list first, so a double free leaves the pool unchanged (a block
        # listed more times than its ref count is a double free too).
        times: dict[int, int] = {}
        for block in blocks:
            times[block.block_id] = times.get(block.block_id, 0) + 1
            if times[block.block_id] > block.ref_cnt:
                raise ValueError(f"double free of block {block.block_id}")
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def uncache(self, block: KVCacheBlock) -> None:
        """Forget ``block``'s cached contents (its K/V is about to be overwritten)."""
        self._evict(block)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (e.g. after the weights change)."""
        for block in list(self.cached_block_hash_to_block.values()):
            self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        block.token_ids = None
        block.cache_id = None
        block.parent_cache_id = None
