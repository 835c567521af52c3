"""Prefix caching in the block pool, the KV cache manager and the scheduler (no model).

Exact scenarios at ``block_size`` 4 pin block ids, ref counts, free-queue (eviction) order and
``num_computed_tokens`` step by step. A forced hash collision must never return a block whose
tokens or parent chain differ. The property test drives random add/step/abort sequences
through the scheduler's simulated model (``scheduler_sim.Sim``: every scheduled token is
written into a fake paged cache and each sequence must read back whole before it samples) and
checks after every step that ref counts equal the live holders, free + used = total, and every
cached block really holds the tokens its hash entry claims.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.config import SchedulerConfig
from localchat.engine.kv_cache import KVCacheManager, manager
from localchat.engine.outputs import ModelRunnerOutput
from localchat.engine.request import FinishReason, Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler

from ..scheduler_sim import Sim


def sampled(**tokens: int) -> ModelRunnerOutput:
    """A step's runner output: one sampled token per named request."""
    return ModelRunnerOutput({rid: [t] for rid, t in tokens.items()})


def req(rid: str, tokens: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, list(tokens), SamplingParams(temperature=0.0), max_tokens=max_tokens)


def refs(kv: KVCacheManager) -> list[int]:
    return [b.ref_cnt for b in kv.block_pool.blocks]


def hashed(kv: KVCacheManager) -> list[int]:
    return [b.block_id for b in kv.block_pool.blocks if b.block_hash is not None]


def test_two_turns_reuse_prompt_and_reply_blocks_step_by_step():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), kv, 1000)
    a = req("a", list(range(1, 11)), max_tokens=3)  # 10 prompt tokens
    sched.add_request(a)

    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 10} and a.num_cached_tokens == 0
    assert a.block_ids == [0, 1, 2] and refs(kv) == [1, 1, 1, 0, 0, 0]
    assert hashed(kv) == [0, 1]  # only full blocks are cached
    assert kv.block_pool.free_block_ids == [3, 4, 5]
    sched.update_from_output(out, sampled(a=11))
    assert a.num_computed_tokens == 10

    out = sched.schedule()  # decode position 10 (token 11)
    sched.update_from_output(out, sampled(a=12))
    assert a.num_computed_tokens == 11 and hashed(kv) == [0, 1]
    out = sched.schedule()  # position 11 (token 12) fills block 2: the reply is cached too
    assert hashed(kv) == [0, 1, 2]
    assert kv.block_pool.blocks[2].token_ids == (9, 10, 11, 12)
    sched.update_from_output(out, sampled(a=13))
    assert a.finish_reason is FinishReason.LENGTH
    # Freed tail first: the sequence's tail is evicted before its head.
    assert refs(kv) == [0] * 6 and kv.block_pool.free_block_ids == [3, 4, 5, 2, 1, 0]
    assert hashed(kv) == [0, 1, 2]

    # Turn 2: the whole of turn 1 (prompt and reply) plus two new tokens.
    b = req("b", list(range(1, 13)) + [20, 21])
    sched.add_request(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 12 and out.num_scheduled_tokens == {"b": 2}
    assert b.num_computed_tokens == 12
    assert b.block_ids == [0, 1, 2, 3] and refs(kv) == [1, 1, 1, 1, 0, 0]
    assert kv.block_pool.free_block_ids == [4, 5]
    assert kv.stats.queries == 10 + 14 and kv.stats.hits == 12


def test_full_prefix_hit_still_computes_the_last_token():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), kv, 1000)
    a = req("a", list(range(12)), max_tokens=1)  # exactly 3 full blocks
    sched.add_request(a)
    sched.update_from_output(sched.schedule(), sampled(a=99))
    assert a.is_finished and hashed(kv) == [0, 1, 2]

    same = req("same", list(range(12)))
    sched.add_request(same)
    out = sched.schedule()
    # Reusing all 12 tokens would leave nothing to compute and no fresh logits: the last
    # block is recomputed (its last token is the one whose logits are sampled).
    assert same.num_cached_tokens == 8 and out.num_scheduled_tokens == {"same": 4}
    assert same.block_ids[:2] == [0, 1] and same.block_ids[2] != 2
    assert same.num_computed_tokens + 4 == same.num_tokens


def test_eviction_is_lru_and_evicts_a_sequence_tail_before_its_head():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = req("a", [1, 2, 3, 4])
    assert kv.allocate_slots(a, 4)
    kv.free(a)
    assert kv.block_pool.free_block_ids == [2, 3, 1, 0]  # a's tail (1) before its head (0)
    c = req("c", [7, 8, 9])
    assert kv.allocate_slots(c, 3)  # never-used blocks go first: a's cache survives
    assert c.block_ids == [2, 3] and hashed(kv) == [0, 1, 2]
    d = req("d", [5, 6])
    assert kv.allocate_slots(d, 2)  # evicts a's tail
    assert d.block_ids == [1] and kv.block_pool.blocks[1].token_ids == (5, 6)

    again = req("again", [1, 2, 3, 4, 5])
    blocks, n = kv.get_computed_blocks(again)
    assert [b.block_id for b in blocks] == [0] and n == 2  # the head is still cached
    assert kv.allocate_slots(again, 3, new_computed_blocks=blocks) is False  # 1 free, 2 needed
    assert refs(kv) == [0, 1, 1, 1] and kv.block_pool.free_block_ids == [0]  # unchanged
    kv.free(c)
    assert kv.block_pool.free_block_ids == [0, 3, 2]
    assert kv.allocate_slots(again, 3, new_computed_blocks=blocks)
    assert again.block_ids == [0, 3, 2] and refs(kv) == [1, 1, 1, 1]
    kv.free(again)
    # A reused block is recently used: it goes to the back with the request's other blocks.
    assert kv.block_pool.free_block_ids == [2, 3, 0]


def test_forced_hash_collision_never_returns_other_tokens(monkeypatch):
    monkeypatch.setattr(manager, "hash_block_tokens", lambda parent, tokens: 0)
    kv = KVCacheManager(num_blocks=8, block_size=2)
    a = req("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(a, 5)
    kv.free(a)
    # Every block hashes to 0: a different first block must miss despite the equal hash.
    other = req("other", [9, 9, 3, 4, 5])
    assert kv.get_computed_blocks(other) == ([], 0)
    same_head = req("same", [1, 2, 8, 8, 8])
    blocks, n = kv.get_computed_blocks(same_head)
    assert n == 2 and blocks[0].token_ids == (1, 2)


def test_colliding_chained_hash_with_another_parent_is_a_miss(monkeypatch):
    # A hash that ignores the parent: block "y" after "x" and after "w" collide.
    monkeypatch.setattr(manager, "hash_block_tokens", lambda parent, tokens: hash(tokens))
    kv = KVCacheManager(num_blocks=8, block_size=2)
    xy = req("xy", [1, 1, 5, 5, 0])
    wy = req("wy", [2, 2, 5, 5, 0])
    assert kv.allocate_slots(xy, 5) and kv.allocate_slots(wy, 5)
    kv.free(xy)
    kv.free(wy)
    # (5, 5) is cached only after (1, 1); a request "w y" finds its own head but must not take
    # the (5, 5) block whose K/V was computed after "x".
    blocks, n = kv.get_computed_blocks(req("q", [2, 2, 5, 5, 0]))
    assert n == 2 and blocks[0].token_ids == (2, 2)
    blocks, n = kv.get_computed_blocks(req("q2", [1, 1, 5, 5, 0]))
    assert n == 4


def test_caching_off_never_shares():
    kv = KVCacheManager(num_blocks=4, block_size=2, enable_caching=False)
    a = req("a", [1, 2, 3])
    assert kv.allocate_slots(a, 3)
    kv.free(a)
    assert hashed(kv) == []
    assert kv.get_computed_blocks(req("b", [1, 2, 3])) == ([], 0)


# -- property test ---------------------------------------------------------------------------

BASES = [[(7 * k + i) % 13 for i in range(60)] for k in range(3)]

actions = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 40), st.integers(1, 8)),
        st.tuples(st.just("step"), st.integers(1, 3), st.just(0), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 30), st.just(0), st.just(0)),
    ),
    min_size=1, max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(actions=actions, block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(12, 30),
       max_batched=st.integers(4, 48), max_seqs=st.integers(1, 4))
def test_random_add_step_abort_keeps_cache_integrity(actions, block_size, num_blocks,
                                                     max_batched, max_seqs):
    sim = Sim(num_blocks, block_size, max_batched, max_seqs, enable_caching=True)
    pool = sim.kv.block_pool
    added: list[str] = []

    def check_cached_contents():
        for h, block in pool.cached_block_hash_to_block.items():
            assert block.block_hash == h
            for off, token in enumerate(block.token_ids):
                assert sim.cache[block.block_id * block_size + off] == token

    for op, a, b, c in actions:
        if op == "add":
            # Prompts that share prefixes (the same base), so hits and sharing happen.
            if b + c > num_blocks * block_size:
                continue
            rid = f"r{len(added)}"
            r = req(rid, BASES[a][:b], max_tokens=c)
            sim.reqs[rid] = r
            sim.sched.add_request(r)
            added.append(rid)
        elif op == "abort" and added:
            sim.sched.abort_request(added[a % len(added)])
            sim.check_state()
        else:
            for _ in range(b):
                if sim.sched.has_unfinished_requests():
                    sim.step()
                    check_cached_contents()
    sim.run()
    check_cached_contents()
    assert all(x.ref_cnt == 0 for x in pool.blocks)
    assert pool.num_free_blocks == num_blocks
    for rid in added:
        r = sim.reqs[rid]
        assert r.is_finished and r.block_ids == []
        if r.finish_reason is FinishReason.LENGTH:
            assert r.output_token_ids == [100 + j for j in range(r.max_tokens)]
