"""Per-request block lists over a ``BlockPool``: how many blocks each request holds and
which slots its next tokens go to. Prefix caching (``get_computed_blocks``) arrives with the
KV cache issue; this manager already owns all block bookkeeping so that it can."""

from __future__ import annotations

from ..request import Request
from .block_pool import BlockPool, KVCacheBlock


class KVCacheManager:
    """Allocates blocks so that a request's ``num_tokens`` fit in ``block_size``-token blocks.

    ``request.block_ids`` mirrors the blocks held (sequence order) for the model runner.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self._blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use, in [0, 1]."""
        return self.block_pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens after ``num_computed_tokens``.

        Returns ``False`` (allocating nothing) when the pool has too few free blocks.
        """
        blocks = self._blocks.setdefault(request.request_id, [])
        total = request.num_computed_tokens + num_new_tokens
        extra = self.num_blocks_needed(total) - len(blocks)
        if extra <= 0:
            return True
        if extra > self.block_pool.num_free_blocks:
            return False
        new = self.block_pool.allocate(extra)
        blocks.extend(new)
        request.block_ids.extend(b.block_id for b in new)
        return True

    def free(self, request: Request) -> None:
        """Return all of ``request``'s blocks to the pool (finish, abort or preemption)."""
        blocks = self._blocks.pop(request.request_id, [])
        self.block_pool.free(blocks)
        request.block_ids.clear()
