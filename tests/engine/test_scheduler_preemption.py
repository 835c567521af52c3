"""Scheduler: recompute preemption (newest first, back to the queue's front), aborts, and
random workloads that must all complete with the right tokens and every block freed.

No model: ``scheduler_sim.Sim`` drives a real ``KVCacheManager`` and checks every step's cache
contents and invariants (see there). Admission, budgets, chunking, stops and drafts:
``test_scheduler.py``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.request import FinishReason, RequestStatus

from .scheduler_sim import TOKEN_BASE, Sim


def test_preemption_picks_newest_frees_blocks_and_it_completes():
    sim = Sim(num_blocks=4, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 7, max_tokens=5)
    b = sim.add("b", 7, max_tokens=3)
    sim.step()  # a:7 b:7 -> 4 blocks used
    sim.step()  # a:1 b:1 -> 9 tokens each, 8 computed
    b_blocks = list(b.block_ids)
    assert sim.kv.block_pool.num_free_blocks == 0
    out = sim.step()  # a needs a 3rd block: b (newest) is preempted
    assert out.num_scheduled_tokens == {"a": 1}
    assert sim.preempted == ["b"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.block_ids == [] and b.output_token_ids == [100, 101]
    assert list(sim.sched.waiting) == [b]
    assert a.block_ids[2] in b_blocks
    sim.run()
    # b is recomputed from scratch: prompt + its 2 outputs in one chunk, then its last token.
    assert sim.steps[5] == {"b": 9}
    assert a.output_token_ids == [100, 101, 102, 103, 104]
    assert b.output_token_ids == [100, 101, 102]
    assert a.finish_reason is b.finish_reason is FinishReason.LENGTH
    assert sim.kv.block_pool.num_free_blocks == 4


def test_preemption_victim_is_the_newest_of_three():
    sim = Sim(num_blocks=6, block_size=4, max_batched=100, max_seqs=4)
    for rid in "abc":
        sim.add(rid, 8, max_tokens=4)
    sim.step()
    c_blocks = list(sim.reqs["c"].block_ids)
    sim.add("d", 1, max_tokens=1)
    out = sim.step()
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert sim.preempted == ["c"]
    # The preempted request goes back to the front of the queue, ahead of newer arrivals.
    assert [r.request_id for r in sim.sched.waiting] == ["c", "d"]
    assert set(c_blocks) == {sim.reqs["a"].block_ids[2], sim.reqs["b"].block_ids[2]}
    sim.run()
    for rid in "abc":
        assert sim.reqs[rid].output_token_ids == [100, 101, 102, 103]
    assert sim.reqs["d"].output_token_ids == [100]


def test_newest_request_that_cannot_grow_preempts_itself():
    sim = Sim(num_blocks=3, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 5, max_tokens=2)  # 2 blocks
    b = sim.add("b", 4, max_tokens=2)  # 1 block
    sim.step()
    out = sim.step()  # a: 6 tokens fit in 2 blocks; b: 5 tokens need a 2nd block, none free
    assert out.num_scheduled_tokens == {"a": 1}
    assert sim.preempted == ["b"] and b.num_computed_tokens == 0 and b.block_ids == []
    assert a.is_finished
    sim.run()
    assert b.output_token_ids == [100, 101]


def test_abort_running_and_waiting_requests():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=1)
    a = sim.add("a", 9, max_tokens=10)
    b = sim.add("b", 3, max_tokens=10)
    sim.step()
    assert len(a.block_ids) == 3 and sim.kv.block_pool.num_free_blocks == 5
    assert sim.sched.abort_request("a") is a
    assert a.is_finished and a.finish_reason is FinishReason.ABORT
    assert a.block_ids == [] and sim.kv.block_pool.num_free_blocks == 8
    assert a not in sim.sched.running
    assert sim.sched.abort_request("a") is None  # already gone
    assert sim.sched.abort_request("nope") is None
    assert sim.sched.abort_request("b") is b
    assert b.finish_reason is FinishReason.ABORT and not sim.sched.waiting
    assert not sim.sched.has_unfinished_requests()
    assert sim.sched.schedule().is_empty
    sim.check_state()


def test_abort_mid_chunked_prefill_frees_partial_blocks():
    sim = Sim(num_blocks=8, block_size=4, max_batched=6, max_seqs=4)
    a = sim.add("a", 20, max_tokens=1)
    sim.step()
    assert len(a.block_ids) == 2
    sim.sched.abort_request("a")
    assert sim.kv.block_pool.num_free_blocks == 8 and a.output_token_ids == []


workload = st.lists(
    st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 10)),
    min_size=1, max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(
    reqs=workload,
    block_size=st.sampled_from([1, 2, 4, 16]),
    spare_blocks=st.integers(0, 12),
    max_batched=st.integers(1, 48),
    max_seqs=st.integers(1, 5),
    caching=st.booleans(),
    separate=st.booleans(),
)
def test_random_workloads_complete(reqs, block_size, spare_blocks, max_batched, max_seqs,
                                   caching, separate):
    # The pool always fits the largest single request (prompt + outputs - 1 computed tokens).
    need = max(-(-(p + m - 1) // block_size) for _, p, m in reqs)
    num_blocks = need + spare_blocks
    sim = Sim(num_blocks, block_size, max_batched, max_seqs, enable_caching=caching,
              separate_prompt_steps=separate)
    arrivals = sorted(enumerate(reqs), key=lambda x: (x[1][0], x[0]))
    step = 0
    order = []
    while arrivals or sim.sched.has_unfinished_requests():
        while arrivals and arrivals[0][1][0] <= step:
            i, (_, p, m) = arrivals.pop(0)
            sim.add(f"r{i}", p, m)
            order.append(f"r{i}")
        if sim.sched.has_unfinished_requests():
            # a decode row: one token left to compute, the last sampled (not a prompt's)
            decoding = {rid: r.num_computed_tokens >= max(r.num_prompt_tokens, r.num_tokens - 1)
                        for rid, r in sim.reqs.items()}
            sim.step()
            if separate:  # the CPU scheduler: decode rows and prompt tokens never share a step
                kinds = {bool(decoding[rid]) for rid in sim.steps[-1]}
                assert len(kinds) <= 1, sim.steps[-1]
        step += 1
        assert step < 5000, "no progress"
    for i, (_, p, m) in enumerate(reqs):
        r = sim.reqs[f"r{i}"]
        assert r.finish_reason is FinishReason.LENGTH
        assert r.output_token_ids == [TOKEN_BASE + j for j in range(m)]
    assert sim.kv.block_pool.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in sim.kv.block_pool.blocks)
    assert not sim.sched.running and not sim.sched.waiting
    firsts = [sim.first_scheduled[rid] for rid in order]
    assert firsts == sorted(firsts), "first admission is not in arrival order"


def test_preempted_request_is_not_readmitted_in_the_same_step():
    """Re-admitting a request in the step that preempted it would discard its cache only to
    recompute it (found by the property test: 1-token prompts, block_size 1, budget 2)."""
    sim = Sim(num_blocks=3, block_size=1, max_batched=2, max_seqs=2)
    a = sim.add("a", 1, max_tokens=2)
    b = sim.add("b", 1, max_tokens=2)
    sim.step()
    out = sim.step()  # a takes the last free block; b needs one more and preempts itself
    assert out.num_scheduled_tokens == {"a": 1}
    assert sim.preempted == ["b"] and b.status is RequestStatus.WAITING
    assert a.is_finished
    sim.run()
    assert sim.steps[2:] == [{"b": 2}]
    assert b.output_token_ids == [100, 101]
