"""Who runs this step: FCFS under a token budget and a sequence budget.

Running requests are served first (one token each when decoding; the rest of their prompt in
chunks when a prefill was split), then waiting requests are admitted in arrival order while
the budgets and free KV blocks allow; an admitted request starts after its longest cached
prefix (``KVCacheManager.get_computed_blocks``). When a running request cannot get a block, the newest
running request is preempted: its blocks are freed and it is recomputed later (vLLM's
recompute preemption). Reference design: vLLM v1 ``Scheduler``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .config import SchedulerConfig
from .kv_cache import KVCacheManager
from .outputs import ModelRunnerOutput
from .request import FinishReason, Request, RequestStatus


@dataclass
class SchedulerOutput:
    """This step's work: ``num_scheduled_tokens[request_id]`` new tokens per scheduled
    request, in ``scheduled`` order (the order rows appear in the flattened batch).

    ``scheduled_spec_decode_tokens``: request id -> the draft token ids scheduled for
    verification (the last ``len(drafts)`` of that request's ``num_scheduled_tokens``); only
    requests that speculate this step appear (vLLM v1's field of the same name).
    """

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """FCFS scheduler with chunked prefill and recompute preemption.

    ``max_model_len`` (tokens) caps prompt + output per request.
    """

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 max_model_len: int, separate_prompt_steps: bool = False) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # Steps compute decode rows or prompt tokens, never both (the CPU engine: see
        # _step_kind); the kind of the last step that had to choose.
        self.separate_prompt_steps = separate_prompt_steps
        self._last_kind: str | None = None

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, spec_token_ids: dict[str, list[int]] | None = None) -> SchedulerOutput:
        """This step's ``SchedulerOutput``. ``spec_token_ids``: request id -> draft token ids
        proposed for a decoding request (the draft proposer's output); a request verifies as
        many of them as the token budget leaves room for, in the same forward pass.

        With ``separate_prompt_steps`` a step holds decode rows (with their drafts) or prompt
        tokens, never both: where both wait, steps alternate (a prompt step first). On CPU a
        decode row batched with a prompt chunk would take the prompt's kernels (a GEMM over
        dequantized weights, SDPA; exact fp32 kernels on an automatically fp32 engine)
        instead of the row kernels it takes alone, so a greedy reply changed with what other
        clients sent at the same moment (a trial measured it through ``serve``); alone, the
        row kernels' batch invariance makes each decode row's bits independent of its
        batchmates."""
        if not self.separate_prompt_steps:
            return self._schedule(spec_token_ids, None)
        kind = self._step_kind()
        out = self._schedule(spec_token_ids, kind)
        if out.is_empty and kind is not None:  # e.g. no KV blocks to admit the waiting one
            kind = "decode" if kind == "prompt" else "prompt"
            out = self._schedule(spec_token_ids, kind)
        self._last_kind = kind
        return out

    @staticmethod
    def _decoding(req: Request) -> bool:
        """Whether ``req``'s next forward computes a decode row: its last sampled token (and
        drafts), nothing of its prompt (``llm_engine.computes_prompt``'s complement)."""
        return req.num_computed_tokens >= max(req.num_prompt_tokens, req.num_tokens - 1)

    def _step_kind(self) -> str | None:
        """"decode" or "prompt" where decode rows and prompt tokens both wait (alternating,
        a prompt step first), else None (no choice to make)."""
        decoding = any(self._decoding(r) for r in self.running)
        prompting = any(not self._decoding(r) for r in self.running) or (
            bool(self.waiting) and len(self.running) < self.config.max_num_seqs)
        if not (decoding and prompting):
            return None
        return "decode" if self._last_kind == "prompt" else "prompt"

    def _schedule(self, spec_token_ids: dict[str, list[int]] | None,
                  kind: str | None) -> SchedulerOutput:
        """``schedule``'s step, with only the requests of ``kind`` ("decode": decoding
        running requests; "prompt": running requests still in their prompt, then waiting
        ones; None: all)."""
        drafts = spec_token_ids or {}
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        preempted = False
        # 1. running requests, oldest first
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if kind is not None and self._decoding(req) != (kind == "decode"):
                i += 1
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if self._chunk_cut(req.num_tokens - req.num_computed_tokens, n):
                i += 1  # its chunk waits for a step whose budget it has to itself
                continue
            # A decoding request with draft tokens verifies them in the same forward pass.
            spec = drafts.get(req.request_id, [])[:max(budget - n, 0)] if n == 1 else []
            n += len(spec)
            while not self.kv.allocate_slots(req, n):
                victim = self.running.pop()  # newest
                self._preempt(victim)
                preempted = True
                out.scheduled = [r for r in out.scheduled if r is not victim]
                budget += out.num_scheduled_tokens.pop(victim.request_id, 0)
                out.scheduled_spec_decode_tokens.pop(victim.request_id, None)
                if victim is req:
                    break
            else:
                out.scheduled.append(req)
                out.num_scheduled_tokens[req.request_id] = n
                if spec:
                    out.scheduled_spec_decode_tokens[req.request_id] = spec
                budget -= n
                i += 1
                continue
            break  # req itself was preempted
        # 2. waiting requests in arrival order. Not in a step that preempted: the blocks just
        # freed are too few for the running requests, and re-admitting a request preempted a
        # moment ago would only throw its cache away to recompute it (vLLM v1 does the same).
        while (not preempted and kind != "decode" and self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            # The longest cached prefix (earlier turns of a conversation, or this request's
            # own blocks from before a preemption) is not recomputed.
            hits, num_hit_tokens = self.kv.get_computed_blocks(req)
            n = min(req.num_tokens - req.num_computed_tokens - num_hit_tokens, budget)
            if self._chunk_cut(req.num_tokens - req.num_computed_tokens - num_hit_tokens, n):
                break
            if not self.kv.allocate_slots(req, n, new_computed_blocks=hits):
                break
            self.waiting.popleft()
            req.num_computed_tokens += num_hit_tokens
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.perf_counter()
                req.num_cached_tokens = num_hit_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(req)
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n
        return out

    def _chunk_cut(self, remaining: int, n: int) -> bool:
        """Whether a prompt chunk of ``n`` of a request's ``remaining`` prompt tokens is
        shorter than the one it gets alone (``min(remaining, max_num_batched_tokens)``)
        because other requests took part of this step's budget. With
        ``separate_prompt_steps`` (the CPU engine) such a chunk is not scheduled: its rows
        would take other kernels and split its attention elsewhere than alone, so its reply
        would depend on what else arrived (``ModelRunner.step_groups``)."""
        return self.separate_prompt_steps and n < min(remaining,
                                                      self.config.max_num_batched_tokens)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[Request]:
        """Apply one step's ``ModelRunnerOutput``: advance ``num_computed_tokens``, append the
        sampled tokens (and their logprobs), count verified and accepted drafts, check stop
        conditions. The scheduler is the only part of the engine that mutates a ``Request``
        (nano-vllm's ``Scheduler.postprocess``).

        ``runner_output.sampled_token_ids`` maps request id -> the tokens sampled for it (one,
        or for a request verifying drafts the accepted drafts plus one target token); only
        requests whose prompt is fully computed sample. K/V of rejected drafts does not count
        as computed, and blocks past the request's tokens are released
        (``KVCacheManager.truncate``). Tokens after a stop condition are dropped. Returns the
        requests that got tokens or finished this step; ``req.num_new_tokens`` says how many
        tokens each got.
        """
        now = time.perf_counter()
        touched = []
        sampled = runner_output.sampled_token_ids
        for req in scheduler_output.scheduled:
            rid = req.request_id
            spec = scheduler_output.scheduled_spec_decode_tokens.get(rid, [])
            tokens = sampled.get(rid)
            num_accepted = runner_output.num_accepted_tokens.get(rid, 0) if tokens else 0
            req.num_computed_tokens += (scheduler_output.num_scheduled_tokens[rid]
                                        - len(spec) + num_accepted)
            req.num_new_tokens = 0
            if not tokens:
                continue
            if spec:
                req.num_draft_tokens += len(spec)
                req.num_accepted_tokens += num_accepted
            req.output_logprobs.extend(runner_output.logprobs.get(rid, ()))
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            for token in tokens:
                req.output_token_ids.append(token)
                req.num_new_tokens += 1
                if token in req.stop_token_ids:
                    self.finish(req, FinishReason.STOP)
                    req.stop_reason = token
                elif (len(req.output_token_ids) >= req.max_tokens
                      or req.num_tokens >= self.max_model_len):
                    self.finish(req, FinishReason.LENGTH)
                if req.is_finished:
                    break
            if spec and not req.is_finished:
                self.kv.truncate(req, req.num_tokens)
            touched.append(req)
        return touched

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Mark ``req`` finished with ``reason`` and free its blocks."""
        if req.is_finished:
            return
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.kv.free(req)
        self.requests.pop(req.request_id, None)

    def stop_at_string(self, req: Request, stop: str) -> None:
        """A stop string ended ``req``'s text (found by its detokenizer): finish it if it is
        still running, and report ``FinishReason.STOP`` with the string as ``stop_reason``
        (also when a token limit or a stop token finished it first: the text ends at the
        string)."""
        self.finish(req, FinishReason.STOP)
        req.finish_reason = FinishReason.STOP
        req.stop_reason = stop

    def abort_request(self, request_id: str) -> Request | None:
        """Finish ``request_id`` with ``FinishReason.ABORT``; unknown ids are ignored."""
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req, FinishReason.ABORT)
        return req
