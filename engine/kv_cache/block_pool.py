"""The pool of fixed-size KV blocks (vLLM's ``BlockPool``, Kwon et al. 2023, arXiv 2309.06180).

Blocks are handed out from a free queue and returned when their ``ref_cnt`` drops to zero.
``block_hash`` is reserved for prefix caching (its own issue): a freed block keeps it until the
block is reused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class KVCacheBlock:
    """One block of ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


class BlockPool:
    """``num_blocks`` blocks; ``allocate(n)`` takes from the front of the free queue (least
    recently freed first), ``free(blocks)`` decrements ref counts and appends blocks that reach
    zero to the back.

    Raises ``ValueError`` when asked for more blocks than are free, or when freeing a block
    whose ref count is already zero (a double free).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free: deque[KVCacheBlock] = deque(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        out = []
        for _ in range(n):
            block = self._free.popleft()
            block.ref_cnt = 1
            block.block_hash = None
            out.append(block)
        return out

    def free(self, blocks: list[KVCacheBlock]) -> None:
        # Validate the whole list first, so a double free leaves the pool unchanged (a block
        # listed more times than its ref count is a double free too).
        times: dict[int, int] = {}
        for block in blocks:
            times[block.block_id] = times.get(block.block_id, 0) + 1
            if times[block.block_id] > block.ref_cnt:
                raise ValueError(f"double free of block {block.block_id}")
        # Free the tail first, so a later reuse of the head keeps its prefix longest.
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free.append(block)
