"""Speculative decoding wired into the engine's step: draft before scheduling, verify in the
target's forward pass (``ModelRunner`` + ``RejectionSampler``), then roll the draft back and
learn from the outcome (``AdaptiveDraftLength``). Also loads the draft model and keeps the
statistics (drafted, accepted, acceptance by position, time in draft vs target).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import EngineConfig, ModelConfig
from ..errors import ModelLoadError
from ..kv_cache import allocate_kv_caches
from ..outputs import ModelRunnerOutput
from ..request import Request
from ..scheduler import SchedulerOutput
from .adaptive import AdaptiveDraftLength
from .ngram import NgramProposer
from .proposer import DraftModelProposer


@dataclass
class SpecStats:
    """Speculation totals: draft tokens proposed and accepted, accepted count per draft
    position (index 0 = first draft token), and seconds spent in the draft and in target
    steps that verified drafts."""

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    target_time_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification step (accepted drafts + the target's token)."""
        if not self.num_verify_steps:
            return 0.0
        return (self.num_accepted_tokens + self.num_verify_steps) / self.num_verify_steps

    def record(self, k: int, accepted: int) -> None:
        while len(self.drafted_by_position) < k:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(k):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += int(i < accepted)
        self.num_draft_tokens += k
        self.num_accepted_tokens += accepted
        self.num_verify_steps += 1


def check_vocab(target: ModelConfig, draft: ModelConfig, target_name: str,
                draft_name: str) -> None:
    """Raise ``ModelLoadError`` naming both sizes when the vocabularies differ."""
    if target.vocab_size != draft.vocab_size:
        raise ModelLoadError(
            f"draft model {draft_name} has a vocabulary of {draft.vocab_size} tokens but "
            f"{target_name} has {target.vocab_size}: a draft must share the target's tokenizer"
        )


class Speculator:
    """The engine's speculative decoding: owns the proposer, the adaptive controller and the
    stats. ``LLMEngine.step`` calls ``propose`` before scheduling and ``finish_step`` after
    the scheduler applied the sampled tokens."""

    def __init__(self, proposer: DraftModelProposer | NgramProposer,
                 controller: AdaptiveDraftLength,
                 max_model_len: int) -> None:
        self.proposer = proposer
        self.controller = controller
        self.max_model_len = max_model_len
        self.stats = SpecStats()
        self._proposed: list[Request] = []
        self._draft_forwards = 0
        self._draft_time = 0.0
        # the previous decode step: when it began (perf_counter s) and its seconds in the
        # draft and target forwards; the rest of the time to this step is its overhead
        self._step_start: float | None = None
        self._step_busy = 0.0

    @classmethod
    def load(cls, draft_path: Path, target_config: ModelConfig, config: EngineConfig,
             pool_tokens: int, max_model_len: int, *, cache_dir: Path | None = None
             ) -> Speculator:
        """Load the draft at ``draft_path`` beside a target (vocabularies must match) with a
        KV pool of ``pool_tokens`` tokens. Raises ``ModelLoadError``."""
        model, draft_config = cls.load_draft_model(draft_path, target_config, config,
                                                   max_model_len, cache_dir=cache_dir)
        return cls.build(model, draft_config, target_config, config, pool_tokens,
                         max_model_len)

    @staticmethod
    def load_draft_model(draft_path: Path, target_config: ModelConfig, config: EngineConfig,
                         max_model_len: int, *, cache_dir: Path | None = None):
        """``(model, draft ModelConfig)``: the draft's weights only (no KV pool yet, so that
        the engine can plan both pools from the memory left). Raises ``ModelLoadError``."""
        from ..loader import load_model, load_model_config
        from ..quant.schemes import auto_fp32_takes_a8

        device, dtype = config.resolved_device(), config.resolved_dtype()
        draft_config = load_model_config(draft_path, cache_dir)
        check_vocab(target_config, draft_config, "the target", str(draft_path))
        model = load_model(draft_path, draft_config, dtype=dtype, device=device,
                           max_position=max_model_len, cache_dir=cache_dir, quant=config.quant,
                           progress=config.quant.progress,
                           a8_fp32=auto_fp32_takes_a8(device, config.dtype, dtype))
        return model, draft_config

    @classmethod
    def build_ngram(cls, target_config: ModelConfig, config: EngineConfig,
                    max_model_len: int) -> Speculator:
        """A speculator drafting by prompt lookup (``ngram.NgramProposer``): no draft model
        or KV pool; the controller prices a draft at nothing (``draft_cost_ratio`` 0), so
        only the verification's measured cost decides how many drafts pay."""
        spec = config.speculative
        proposer = NgramProposer(target_config.vocab_size, config.resolved_device())
        controller = AdaptiveDraftLength(spec.num_speculative_tokens, 0.0,
                                         adaptive=spec.adaptive)
        return cls(proposer, controller, max_model_len)

    @classmethod
    def build(cls, model, draft_config: ModelConfig, target_config: ModelConfig,
              config: EngineConfig, pool_tokens: int, max_model_len: int) -> Speculator:
        """Allocate the draft's KV pool (``pool_tokens`` tokens) and wire the speculator."""
        spec = config.speculative
        device, block_size = config.resolved_device(), config.cache.block_size
        num_blocks = -(-pool_tokens // block_size)
        kv_caches = allocate_kv_caches(draft_config.num_hidden_layers, num_blocks, block_size,
                                       draft_config.num_kv_heads, draft_config.head_dim,
                                       config.resolved_kv_dtype(), device)
        proposer = DraftModelProposer(model, kv_caches, num_blocks, block_size, device,
                                      config.cache.enable_prefix_caching,
                                      vocab_size=spec.draft_vocab_size)
        ratio = _param_count(draft_config) / max(_param_count(target_config), 1)
        controller = AdaptiveDraftLength(spec.num_speculative_tokens, ratio,
                                         adaptive=spec.adaptive)
        return cls(proposer, controller, max_model_len)

    def propose(self, running: list[Request],
                generators: dict[str, torch.Generator | None]) -> dict[str, list[int]]:
        """Draft for every decoding request (k from the controller; none for requests that
        ask for logprobs, which plain decoding reports exactly). Returns request id -> draft
        token ids, for ``Scheduler.schedule``; their distributions are in
        :attr:`draft_probs`."""
        ks = {}
        for req in running:
            k = 0
            if req.sampling_params.logprobs is None:
                k = self.controller.num_spec_tokens(req.request_id)
            # Never draft past max_tokens or the context end (the RoPE table's last position).
            room = min(req.max_tokens - len(req.output_token_ids),
                       self.max_model_len - req.num_tokens) - 1
            ks[req.request_id] = max(min(k, room), 0)
        t0 = time.perf_counter()
        self._time_overhead(t0)
        drafts = self.proposer.propose(running, ks, generators)
        self._proposed = [r for r in running if r.request_id in drafts]
        forwards = max((len(d) for d in drafts.values()), default=0)
        if forwards:
            elapsed = time.perf_counter() - t0
            self._step_busy += elapsed
            self.stats.draft_time_s += elapsed
            # A first pass that prefilled a prompt (the draft's first look at a request) costs
            # what a prefill costs, not a draft step: timing it as one made the controller
            # stop drafting (bench_spec measured a 0.5B "draft forward" at 2-3x a 1.5B step).
            if self.proposer.last_catch_up <= max(ks.values(), default=0) + 1:
                self.controller.observe_times(draft=elapsed / forwards)
            else:  # what a probe costs beyond its drafts: the tokens it first catches up on
                self.controller.observe_times(catch_up=(self.proposer.last_catch_up, elapsed))
        return drafts

    def _time_overhead(self, now: float) -> None:
        """Time the previous decode step's overhead (from its start to this one, less its
        forwards) and start timing this step. A gap longer than a plain step is an idle
        engine, not overhead, and is not recorded."""
        if self._step_start is not None:
            overhead = now - self._step_start - self._step_busy
            t_plain = self.controller.t_plain
            if 0.0 <= overhead and t_plain is not None and overhead < t_plain:
                self.controller.observe_times(overhead=overhead)
        self._step_start, self._step_busy = now, 0.0

    @property
    def draft_probs(self) -> dict[str, torch.Tensor]:
        """Request id -> ``[k, vocab]`` fp32 distributions of the latest drafts (sampled
        requests only), for the rejection step (``ModelRunner.execute_model``)."""
        return self.proposer.draft_probs

    def finish_step(self, out: SchedulerOutput, runner_output: ModelRunnerOutput,
                    target_time: float) -> None:
        """Learn from this step's verification, then roll the draft back to what the target
        accepted (also for proposed requests that were not scheduled). Called after
        ``Scheduler.update_from_output``; reads requests, changes only draft-side state."""
        spec = out.scheduled_spec_decode_tokens
        decode_only = all(out.num_scheduled_tokens[r.request_id]
                          == 1 + len(spec.get(r.request_id, [])) for r in out.scheduled)
        self._step_busy += target_time
        if not decode_only:  # a prompt step's gap is not a decode step's overhead
            self._step_start = None
        if spec:
            self.stats.target_time_s += target_time
            if decode_only:
                self.controller.observe_times(verify=(max(len(s) for s in spec.values()),
                                                      target_time))
        elif decode_only and out.scheduled:
            self.controller.observe_times(plain=target_time)
        accepted_counts = runner_output.num_accepted_tokens
        for req in out.scheduled:
            rid = req.request_id
            n_out = len(req.output_token_ids)
            if rid in spec and rid in accepted_counts:
                k, accepted = len(spec[rid]), accepted_counts[rid]
                self.stats.record(k, accepted)
                self.controller.observe(rid, k, accepted, n_out)
            else:
                self.controller.note_generated(rid, n_out)
        for req in self._proposed:
            self.proposer.rollback(req)
        self._proposed = []
        self.proposer.draft_probs = {}

    def free(self, request_id: str) -> None:
        """A request ended: drop its draft state (cached blocks stay) and its estimates."""
        self.proposer.free(request_id)
        self.controller.forget(request_id)


def _param_count(c: ModelConfig) -> int:
    """Approximate weight count of a Llama-family model (the draft-cost prior)."""
    per_layer = (c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
                 + 3 * c.hidden_size * c.intermediate_size)
    return c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size
