"""Scheduler: FCFS, token and sequence budgets, chunked prefill, recompute preemption, stops.

No model: a simulated loop drives a real ``KVCacheManager``. Each step it "writes" every
scheduled token into a fake paged cache (slot -> (request id, token id)) through the request's
block table, and a request whose prompt is complete gets a pretend sampled token that depends
only on its output position (so recomputation after preemption must reproduce it). Before a
request samples, the whole sequence must read back from its block table: the independent check
that no block was lost, shared or overwritten.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.config import SchedulerConfig
from localchat.engine.kv_cache import KVCacheManager
from localchat.engine.outputs import ModelRunnerOutput
from localchat.engine.request import FinishReason, Request, RequestStatus
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler

TOKEN_BASE = 100  # pretend sampled token at output position i is TOKEN_BASE + i


def default_token(req: Request) -> int:
    return TOKEN_BASE + len(req.output_token_ids)


class Sim:
    def __init__(self, num_blocks: int, block_size: int, max_batched: int, max_seqs: int,
                 max_model_len: int = 100_000, enable_caching: bool = False) -> None:
        self.block_size = block_size
        self.max_batched = max_batched
        self.max_seqs = max_seqs
        self.enable_caching = enable_caching
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=enable_caching)
        self.sched = Scheduler(SchedulerConfig(max_num_seqs=max_seqs,
                                               max_num_batched_tokens=max_batched),
                               self.kv, max_model_len)
        self.reqs: dict[str, Request] = {}
        self.cache: dict[int, tuple[str, int]] = {}
        self.steps: list[dict[str, int]] = []
        self.first_scheduled: dict[str, int] = {}
        self.preempted: list[str] = []

    def add(self, rid: str, prompt_len: int, max_tokens: int, stop=()) -> Request:
        req = Request(rid, [i % 50 for i in range(prompt_len)], SamplingParams(temperature=0.0),
                      stop_token_ids=frozenset(stop), max_tokens=max_tokens)
        self.reqs[rid] = req
        self.sched.add_request(req)
        return req

    def owner(self, rid: str, token: int):
        """What a cache slot records: with prefix caching, blocks are shared by every request
        with the same prefix, so only the token (the K/V's content) is checked."""
        return token if self.enable_caching else (rid, token)

    def slot(self, req: Request, pos: int) -> int:
        return req.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, token_fn=default_token):
        computed_before = {rid: r.num_computed_tokens for rid, r in self.reqs.items()}
        out = self.sched.schedule()
        for rid, r in self.reqs.items():
            if r.num_computed_tokens < computed_before[rid]:
                assert r.num_computed_tokens == 0 and rid not in out.num_scheduled_tokens
                self.preempted.append(rid)
        self.check_step(out)
        self.steps.append(dict(out.num_scheduled_tokens))
        sampled = {}
        for r in out.scheduled:
            rid = r.request_id
            n = out.num_scheduled_tokens[rid]
            self.first_scheduled.setdefault(rid, len(self.steps))
            tokens = r.all_token_ids
            for pos in range(r.num_computed_tokens, r.num_computed_tokens + n):
                self.cache[self.slot(r, pos)] = self.owner(rid, tokens[pos])
            if r.num_computed_tokens + n == r.num_tokens:
                for pos in range(r.num_tokens):
                    assert self.cache[self.slot(r, pos)] == self.owner(rid, tokens[pos]), (rid,
                                                                                          pos)
                sampled[rid] = token_fn(r)
        touched = self.sched.update_from_output(
            out, ModelRunnerOutput({rid: [t] for rid, t in sampled.items()}))
        assert {r.request_id for r in touched} == set(sampled)
        for r in touched:
            assert r.output_token_ids[-1] == sampled[r.request_id]
            if not r.is_finished:
                assert r.num_computed_tokens == r.num_tokens - 1
        self.check_state()
        return out

    def check_step(self, out) -> None:
        ids = [r.request_id for r in out.scheduled]
        assert len(ids) == len(set(ids)) and set(ids) == set(out.num_scheduled_tokens)
        assert out.total_num_scheduled_tokens <= self.max_batched
        assert len(self.sched.running) <= self.max_seqs
        for r in out.scheduled:
            n = out.num_scheduled_tokens[r.request_id]
            assert r.status is RequestStatus.RUNNING and r in self.sched.running
            assert 1 <= n <= r.num_tokens - r.num_computed_tokens
            assert len(r.block_ids) * self.block_size >= r.num_computed_tokens + n
        self.check_state()

    def check_state(self) -> None:
        live = [r for r in self.reqs.values() if not r.is_finished]
        held = [b for r in live for b in r.block_ids]
        if not self.enable_caching:
            assert len(held) == len(set(held)), "a block is held by two requests"
        for block in self.kv.block_pool.blocks:
            assert block.ref_cnt == held.count(block.block_id), "ref count != live holders"
        free = self.kv.block_pool.free_block_ids
        assert not set(held) & set(free)
        assert len(set(held)) + len(free) == self.kv.block_pool.num_blocks
        for r in self.sched.waiting:
            assert r.status is RequestStatus.WAITING and r.block_ids == []
            assert r.num_computed_tokens == 0
        for r in self.reqs.values():
            if r.is_finished:
                assert r.block_ids == [] and r not in self.sched.running
            assert r.num_computed_tokens <= r.num_tokens

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("scheduler did not finish")


def test_prefill_then_decode_one_token_each():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 5, max_tokens=3)
    sim.run()
    assert sim.steps == [{"a": 5}, {"a": 1}, {"a": 1}]
    assert a.output_token_ids == [100, 101, 102]
    assert a.finish_reason is FinishReason.LENGTH
    assert sim.kv.block_pool.num_free_blocks == 8


def test_long_prompt_is_chunked_over_several_steps():
    sim = Sim(num_blocks=8, block_size=4, max_batched=8, max_seqs=4)
    a = sim.add("a", 20, max_tokens=2)
    sim.step()
    assert a.num_computed_tokens == 8 and a.output_token_ids == [] and len(a.block_ids) == 2
    sim.step()
    assert a.num_computed_tokens == 16 and a.output_token_ids == []
    sim.step()
    assert a.num_computed_tokens == 20 and a.output_token_ids == [100]
    sim.run()
    assert sim.steps == [{"a": 8}, {"a": 8}, {"a": 4}, {"a": 1}]
    assert a.output_token_ids == [100, 101] and a.is_finished


def test_decodes_first_then_new_prompt_chunk_fills_the_budget():
    sim = Sim(num_blocks=16, block_size=4, max_batched=10, max_seqs=4)
    a = sim.add("a", 4, max_tokens=10)
    sim.step()
    b = sim.add("b", 20, max_tokens=1)
    sim.step()
    sim.step()
    sim.step()
    assert sim.steps == [{"a": 4}, {"a": 1, "b": 9}, {"a": 1, "b": 9}, {"a": 1, "b": 2}]
    assert [r.request_id for r in sim.sched.running] == ["a"]
    assert b.output_token_ids == [100] and b.finish_reason is FinishReason.LENGTH
    assert a.output_token_ids == [100, 101, 102, 103]


def test_max_num_seqs_limits_running_and_admission_is_fcfs():
    sim = Sim(num_blocks=16, block_size=4, max_batched=100, max_seqs=2)
    for rid in "abc":
        sim.add(rid, 3, max_tokens=2)
    sim.step()
    assert sim.steps[-1] == {"a": 3, "b": 3}
    assert [r.request_id for r in sim.sched.waiting] == ["c"]
    sim.run()
    assert sim.steps == [{"a": 3, "b": 3}, {"a": 1, "b": 1}, {"c": 3}, {"c": 1}]
    assert all(r.output_token_ids == [100, 101] for r in sim.reqs.values())


def test_token_budget_admission_order_is_arrival_order():
    sim = Sim(num_blocks=32, block_size=4, max_batched=4, max_seqs=8)
    for rid in "abcd":
        sim.add(rid, 3, max_tokens=2)
    sim.run()
    assert sim.steps[0] == {"a": 3, "b": 1}
    order = sorted(sim.first_scheduled, key=lambda rid: (sim.first_scheduled[rid], rid))
    assert order == list("abcd")
    firsts = [sim.first_scheduled[rid] for rid in "abcd"]
    assert firsts == sorted(firsts)


def test_blocked_head_of_queue_is_not_overtaken():
    """Strict FCFS: when the oldest waiting request does not fit, a smaller later one waits."""
    sim = Sim(num_blocks=4, block_size=4, max_batched=100, max_seqs=8)
    sim.add("a", 10, max_tokens=2)  # 3 blocks
    sim.step()
    sim.add("b", 8, max_tokens=1)  # needs 2 blocks, 1 free
    sim.add("c", 2, max_tokens=1)  # would fit in 1 block
    sim.step()
    assert sim.steps[-1] == {"a": 1}
    assert [r.request_id for r in sim.sched.waiting] == ["b", "c"]
    sim.run()
    assert sim.steps[2] == {"b": 8, "c": 2}


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


def test_stop_token_finishes_with_stop():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 3, max_tokens=10, stop={101, 555})
    sim.run()
    assert a.output_token_ids == [100, 101]
    assert a.finish_reason is FinishReason.STOP
    assert sim.kv.block_pool.num_free_blocks == 8


def test_stop_token_as_first_token():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 3, max_tokens=10, stop={100})
    b = sim.add("b", 3, max_tokens=2)
    sim.run()
    assert a.output_token_ids == [100] and a.finish_reason is FinishReason.STOP
    assert b.output_token_ids == [100, 101] and b.finish_reason is FinishReason.LENGTH


def test_max_tokens_and_max_model_len_finish_with_length():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4, max_model_len=6)
    a = sim.add("a", 4, max_tokens=100)
    b = sim.add("b", 2, max_tokens=1)
    sim.run()
    assert a.output_token_ids == [100, 101] and a.finish_reason is FinishReason.LENGTH
    assert b.output_token_ids == [100] and b.finish_reason is FinishReason.LENGTH


def test_update_from_output_only_touches_sampled_requests():
    sim = Sim(num_blocks=8, block_size=4, max_batched=5, max_seqs=4)
    sim.add("a", 3, max_tokens=5)
    b = sim.add("b", 6, max_tokens=5)
    out = sim.sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3, "b": 2}
    touched = sim.sched.update_from_output(out, ModelRunnerOutput({"a": [7]}))
    assert [r.request_id for r in touched] == ["a"]
    assert b.output_token_ids == [] and b.num_computed_tokens == 2
    assert sim.reqs["a"].output_token_ids == [7] and sim.reqs["a"].num_computed_tokens == 3



def test_drafts_travel_in_the_scheduler_output_and_the_scheduler_applies_the_verification():
    """Drafts come in through ``schedule(spec_token_ids)``, are cut to the token budget and
    leave in ``scheduled_spec_decode_tokens``; ``update_from_output`` counts only the accepted
    drafts as computed, frees the blocks of rejected ones and counts drafted/accepted."""
    sim = Sim(num_blocks=8, block_size=2, max_batched=4, max_seqs=2)
    a = sim.add("a", 3, max_tokens=10)
    sim.sched.update_from_output(sim.sched.schedule(), ModelRunnerOutput({"a": [50]}))
    assert a.num_computed_tokens == 3 and a.num_tokens == 4 and len(a.block_ids) == 2
    out = sim.sched.schedule({"a": [51, 52, 53, 54], "gone": [1]})
    # budget 4 = the decode token + 3 drafts; an unknown id is ignored
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [51, 52, 53]}
    assert len(a.block_ids) == 4  # slots for positions 3..6
    touched = sim.sched.update_from_output(
        out, ModelRunnerOutput({"a": [51, 60]}, num_accepted_tokens={"a": 1}))
    assert touched == [a] and a.num_new_tokens == 2
    assert a.output_token_ids == [50, 51, 60]
    # positions 3 (token 50) and 4 (draft 51, accepted) are computed; 60 is not yet
    assert a.num_computed_tokens == 5 == a.num_tokens - 1
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (3, 1)
    # the rejected drafts' block (position 6) is released: 6 tokens need 3 blocks
    assert len(a.block_ids) == 3 and len(sim.kv.block_pool.free_block_ids) == 5
    # without drafts the next step is a plain decode step
    out = sim.sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}


workload = st.lists(
    st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 10)),
    min_size=1, max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=workload,
    block_size=st.sampled_from([1, 2, 4, 16]),
    spare_blocks=st.integers(0, 12),
    max_batched=st.integers(1, 48),
    max_seqs=st.integers(1, 5),
    caching=st.booleans(),
)
def test_random_workloads_complete(reqs, block_size, spare_blocks, max_batched, max_seqs,
                                   caching):
    # The pool always fits the largest single request (prompt + outputs - 1 computed tokens).
    need = max(-(-(p + m - 1) // block_size) for _, p, m in reqs)
    num_blocks = need + spare_blocks
    sim = Sim(num_blocks, block_size, max_batched, max_seqs, enable_caching=caching)
    arrivals = sorted(enumerate(reqs), key=lambda x: (x[1][0], x[0]))
    step = 0
    order = []
    while arrivals or sim.sched.has_unfinished_requests():
        while arrivals and arrivals[0][1][0] <= step:
            i, (_, p, m) = arrivals.pop(0)
            sim.add(f"r{i}", p, m)
            order.append(f"r{i}")
        if sim.sched.has_unfinished_requests():
            sim.step()
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
