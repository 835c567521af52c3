"""Per-request block lists over a ``BlockPool``, with prefix caching across requests.

A request's K/V lives in ``block_size``-token blocks. Each full block is hashed by chaining
its parent's hash with its token ids (``hash_block_tokens``) and cached in the pool, so a
later request with the same prefix (the next turn of a conversation: the previous prompt
*and* reply) reuses those blocks instead of recomputing them. Reference design: vLLM v1
``KVCacheManager`` (automatic prefix caching).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..request import Request
from .block_pool import BlockPool, KVCacheBlock


def hash_block_tokens(parent_block_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The chained hash of one full block: its parent's hash (``None`` for the first block)
    with the block's ``token_ids``. Python's tuple hash over ints is deterministic across
    runs; collisions are harmless because a hit also compares tokens and the parent chain."""
    return hash((parent_block_hash, token_ids))


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since start: ``queries`` tokens looked up at admission, ``hits``
    tokens found cached."""

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Allocates blocks so that a request's tokens fit in ``block_size``-token blocks, and
    finds and records cached prefixes.

    ``request.block_ids`` mirrors the blocks held (sequence order) for the model runner.
    ``enable_caching=False`` turns prefix caching off (every prompt is computed in full).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.stats = PrefixCacheStats()
        self._blocks: dict[str, list[KVCacheBlock]] = {}
        # request id -> how many of its leading blocks are cached (hashed) already.
        self._num_cached_blocks: dict[str, int] = {}

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use, in [0, 1]."""
        return self.block_pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, request: Request) -> list[int]:
        """Chained hashes of ``request``'s full blocks (prompt and output tokens so far),
        extended incrementally in ``request.block_hashes``."""
        hashes = request.block_hashes
        bs = self.block_size
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, tuple(request.token_ids(i * bs,
                                                                            (i + 1) * bs))))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request``: ``(blocks, num_computed_tokens)``.

        At most ``num_tokens - 1`` tokens are reused, so the last token is always computed
        and its logits are fresh. Pass ``blocks`` to ``allocate_slots(new_computed_blocks=)``.
        """
        if not self.enable_caching or request.num_computed_tokens:
            return [], 0
        bs = self.block_size
        hashes = self.block_hashes(request)
        max_blocks = min((request.num_tokens - 1) // bs, len(hashes))
        blocks: list[KVCacheBlock] = []
        parent = None
        for i in range(max_blocks):
            tokens = tuple(request.token_ids(i * bs, (i + 1) * bs))
            block = self.block_pool.get_cached_block(hashes[i], tokens, parent)
            if block is None:
                break
            blocks.append(block)
            parent = block
        return blocks, len(blocks) * bs

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_lookahead_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       num_tokens_to_cache: int | None = None) -> bool:
        """Make room for ``num_new_tokens`` (+ ``num_lookahead_tokens`` slots, e.g. draft
        tokens) after the request's computed tokens, first taking ``new_computed_blocks``
        (a prefix-cache hit from ``get_computed_blocks``) as computed.

        Full blocks up to ``num_tokens_to_cache`` tokens (default: computed + new) are
        cached. Returns ``False`` and changes nothing when the pool has too few free blocks.
        The caller advances ``request.num_computed_tokens`` (by the hit's tokens now, and by
        ``num_new_tokens`` once the step ran).
        """
        hits = new_computed_blocks or []
        rid = request.request_id
        held = self._blocks.get(rid, [])
        num_computed = request.num_computed_tokens + len(hits) * self.block_size
        total = num_computed + num_new_tokens + num_lookahead_tokens
        extra = max(self.num_blocks_needed(total) - len(held) - len(hits), 0)
        # Cached hits that nobody holds sit in the free queue and count against it.
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if extra + free_hits > self.block_pool.num_free_blocks:
            return False
        held = self._blocks.setdefault(rid, held)
        if new_computed_blocks is not None:
            self.stats.queries += request.num_tokens
            self.stats.hits += len(hits) * self.block_size
        if hits:
            self.block_pool.touch(hits)
            held.extend(hits)
            request.block_ids.extend(b.block_id for b in hits)
            self._num_cached_blocks[rid] = len(held)
        if extra:
            new = self.block_pool.allocate(extra)
            held.extend(new)
            request.block_ids.extend(b.block_id for b in new)
        if self.enable_caching:
            upto = num_computed + num_new_tokens if num_tokens_to_cache is None \
                else num_tokens_to_cache
            self._cache_full_blocks(request, held, min(upto, request.num_tokens))
        return True

    def _cache_full_blocks(self, request: Request, held: list[KVCacheBlock],
                           num_tokens: int) -> None:
        """Hash and cache ``request``'s blocks that ``num_tokens`` tokens fill completely."""
        rid = request.request_id
        start = self._num_cached_blocks.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_full <= start:
            return
        hashes = self.block_hashes(request)
        bs = self.block_size
        i = start
        for i in range(start, num_full):
            parent = held[i - 1] if i else None
            tokens = tuple(request.token_ids(i * bs, (i + 1) * bs))
            if not self.block_pool.cache_block(held[i], hashes[i], tokens, parent):
                # The same prefix is cached by another block (computed concurrently): this
                # request's copy and everything after it stay private.
                break
        else:
            i = num_full
        self._num_cached_blocks[rid] = i

    def truncate(self, request: Request, num_tokens: int) -> None:
        """Keep only the blocks needed for the first ``num_tokens`` tokens (freeing the rest)
        and uncache blocks holding tokens past ``num_tokens`` (speculative rollback)."""
        held = self._blocks.get(request.request_id, [])
        keep = self.num_blocks_needed(num_tokens)
        tail = held[keep:]
        if tail:
            del held[keep:]
            del request.block_ids[keep:]
            self.block_pool.free(tail)
        num_full = num_tokens // self.block_size
        for block in held[num_full:]:
            self.block_pool.uncache(block)
        rid = request.request_id
        self._num_cached_blocks[rid] = min(self._num_cached_blocks.get(rid, 0), num_full)
        del request.block_hashes[num_full:]

    def free(self, request: Request) -> None:
        """Return all of ``request``'s blocks to the pool (finish, abort or preemption).

        Full blocks of its ``num_computed_tokens`` are cached first; cached blocks keep their
        hash and stay reusable until evicted."""
        blocks = self._blocks.get(request.request_id, [])
        if self.enable_caching and blocks:
            # Full blocks computed since the last allocation (accepted draft tokens) are
            # cached too, before their request lets go of them.
            self._cache_full_blocks(request, blocks, min(request.num_computed_tokens,
                                                         request.num_tokens))
        self._blocks.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free(blocks)
        request.block_ids.clear()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix."""
        self.block_pool.reset_prefix_cache()
        self._num_cached_blocks.clear()
