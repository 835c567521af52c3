"""A scheduler simulation for the scheduler tests: no model, a real ``KVCacheManager``.

Each step ``Sim`` "writes" every scheduled token into a fake paged cache (slot -> (request id,
token id)) through the request's block table, and a request whose prompt is complete gets a
pretend sampled token that depends only on its output position (so recomputation after
preemption must reproduce it). Before a request samples, the whole sequence must read back from
its block table: the independent check that no block was lost, shared or overwritten. After
every step the scheduler's invariants are checked (budgets, ref counts, free list, states).
"""

from __future__ import annotations

from localchat.engine.config import SchedulerConfig
from localchat.engine.kv_cache import KVCacheManager
from localchat.engine.outputs import ModelRunnerOutput
from localchat.engine.request import Request, RequestStatus
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler

TOKEN_BASE = 100  # pretend sampled token at output position i is TOKEN_BASE + i


def default_token(req: Request) -> int:
    return TOKEN_BASE + len(req.output_token_ids)


class Sim:
    def __init__(self, num_blocks: int, block_size: int, max_batched: int, max_seqs: int,
                 max_model_len: int = 100_000, enable_caching: bool = False,
                 separate_prompt_steps: bool = False) -> None:
        self.block_size = block_size
        self.max_batched = max_batched
        self.max_seqs = max_seqs
        self.enable_caching = enable_caching
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=enable_caching)
        self.sched = Scheduler(SchedulerConfig(max_num_seqs=max_seqs,
                                               max_num_batched_tokens=max_batched),
                               self.kv, max_model_len,
                               separate_prompt_steps=separate_prompt_steps)
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
