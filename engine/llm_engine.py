"""The synchronous engine: add requests, call ``step()``, read ``RequestOutput``s.

Wires the parts of one chat turn (README, Architecture): tokenizer, scheduler over a paged KV
cache, model runner, sampler, incremental detokenizer. ``generate`` is the one-request
streaming convenience the CLI uses. Reference design: vLLM's ``LLMEngine``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from .. import kernels
from .config import EngineConfig, ModelConfig
from .detokenizer import IncrementalDetokenizer
from .engine_build import build_engine, loaded_weight_format, plan_num_blocks
from .errors import ContextLengthError
from .kv_cache import KVCacheManager, allocate_kv_caches
from .memory.footprint import kv_bytes
from .memory.report import MemoryReport, allocated_bytes, memory_report, module_tensors
from .model_runner import ModelRunner
from .outputs import EngineInfo, EngineStats, RequestMetrics, RequestOutput
from .quant.schemes import auto_fp32_takes_a8
from .request import FinishReason, Request
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    """One model, many requests, one step at a time.

    Build with :meth:`from_path`. ``max_model_len`` is the context size in tokens (prompt +
    output); ``num_blocks`` KV blocks of ``block_size`` tokens back all requests.
    ``speculator`` (a ``spec_decode.Speculator``, or ``None``) drafts tokens for decoding
    requests with a draft model; the target verifies them in its step (greedy output is
    unchanged token for token, sampled output keeps the target's distribution).
    ``model_name`` names the checkpoint in :meth:`get_info` (default: the architecture).
    """

    def __init__(self, model, model_config: ModelConfig, tokenizer: Tokenizer,
                 config: EngineConfig, max_model_len: int, speculator=None, *,
                 model_name: str | None = None) -> None:
        self.model_name = model_name or model_config.architecture
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = max_model_len
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype()
        # fp32 by default on a CPU without native bf16: decode as a bf16 engine would, through
        # the integer-dot kernels (quant.schemes.auto_fp32_takes_a8); step() applies it
        self.a8_fp32 = auto_fp32_takes_a8(self.device, config.dtype, self.dtype)
        self.kv_dtype = config.resolved_kv_dtype()  # fp16 under an fp32 CPU engine by default
        block_size = config.cache.block_size
        self.num_blocks = config.cache.num_blocks or plan_num_blocks(
            config, model_config, self.device, self.kv_dtype, max_model_len)
        pool_tokens = self.num_blocks * block_size
        if pool_tokens < max_model_len:
            # The context does not fit the KV pool: the pool caps it (a sequence longer than
            # the pool could never get its slots and would be preempted forever). A context the
            # user set gets a pool to match (plan_num_blocks) unless cache.num_blocks is fixed.
            log = logger.info if config.scheduler.max_model_len is None else logger.warning
            log("max_model_len capped from %d to %d tokens by the KV cache pool",
                max_model_len, pool_tokens)
            self.max_model_len = max_model_len = pool_tokens
        kv_caches = allocate_kv_caches(
            model_config.num_hidden_layers, self.num_blocks, block_size,
            model_config.num_kv_heads, model_config.head_dim, self.kv_dtype, self.device,
        )
        self.kv_cache_manager = KVCacheManager(
            self.num_blocks, block_size, enable_caching=config.cache.enable_prefix_caching)
        # on CPU, decode rows never share a step with prompt tokens and a step's requests
        # compute as they would alone: each keeps the row kernels' batch-invariant bits
        # (Scheduler.schedule, ModelRunner.step_groups)
        invariant = self.device.type == "cpu" and config.scheduler.batch_invariant
        self.scheduler = Scheduler(config.scheduler, self.kv_cache_manager, max_model_len,
                                   separate_prompt_steps=invariant)
        self.runner = ModelRunner(model, kv_caches, block_size, self.device,
                                  step_groups=invariant)
        self._weight_format, self._group_size = loaded_weight_format(model, self.dtype)
        self._kv_cache_bytes = sum(t.nbytes for t in kv_caches)
        self.speculator = speculator
        self.runner.capture_cuda_graphs(max_model_len)
        self._detoks: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB",
            self.num_blocks, block_size, self.num_blocks * block_size,
            self.num_blocks * block_size * self.kv_bytes_per_token / 2**20,
        )

    @classmethod
    def from_path(cls, path: Path, config: EngineConfig | None = None, *,
                  cache_dir: Path | None = None) -> LLMEngine:
        """Load an HF folder or a ``.gguf`` file (``engine_build.build_engine``).

        ``cache_dir`` keeps converted GGUF metadata (config, tokenizer) for faster reloads.
        ``config.quant.scheme == "auto"`` loads the best weight format the memory planner
        finds to fit this machine (``memory.auto``), lowering the context if it must.
        Raises ``ModelLoadError`` / ``UnsupportedArchitectureError`` for unusable files and
        ``MemoryPlanError`` when no format fits.
        """
        return build_engine(cls, path, config, cache_dir=cache_dir)

    @classmethod
    def from_source(cls, source, config: EngineConfig | None = None, *,
                    cache_dir: Path | None = None) -> LLMEngine:
        """Load a resolved ``hub.ModelSource`` (see :meth:`from_path`)."""
        return cls.from_path(source.path, config, cache_dir=cache_dir)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers (``memory.footprint.kv_bytes``)."""
        return kv_bytes(self.model_config, 1, self.kv_dtype)

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request_id: str | None, prompt_token_ids: list[int],
                    sampling_params: SamplingParams) -> str:
        """Queue a request; returns its id.

        Raises ``ContextLengthError`` when the prompt leaves no room to generate, and
        ``ValueError`` for an empty prompt.
        """
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ContextLengthError(
                f"prompt is {len(prompt_token_ids)} tokens but the context holds "
                f"{self.max_model_len} (prompt + reply)"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        room = self.max_model_len - len(prompt_token_ids)
        max_tokens = min(sampling_params.max_tokens or room, room)
        stop = set(sampling_params.stop_token_ids)
        if not sampling_params.ignore_eos:
            stop |= self.tokenizer.stop_token_ids
        req = Request(request_id, list(prompt_token_ids), sampling_params,
                      stop_token_ids=frozenset(stop), max_tokens=max_tokens)
        self.scheduler.add_request(req)
        self._detoks[request_id] = IncrementalDetokenizer(self.tokenizer,
                                                          stop=sampling_params.stop)
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks; unknown ids are ignored (``None``).

        Returns the request's final ``RequestOutput`` (``finish_reason`` abort, no new tokens,
        ``text_delta`` = text held back so far, incomplete characters dropped).
        """
        req = self.scheduler.abort_request(request_id)
        detok = self._detoks.pop(request_id, None)
        self._release(request_id)
        if req is None or detok is None:
            return None
        delta = detok.flush(drop_incomplete=True)
        return self._output(req, [], delta, detok.text)

    def _release(self, request_id: str) -> None:
        self.runner.release(request_id)
        if self.speculator is not None:
            self.speculator.free(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> EngineStats:
        """Queue sizes, KV cache usage and prefix-cache hit rate now."""
        kv = self.kv_cache_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_blocks=self.num_blocks,
            block_size=kv.block_size,
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.stats.queries,
            prefix_cache_hits=kv.stats.hits,
            num_preemptions=self.scheduler.num_preemptions,
            max_model_len=self.max_model_len,
            spec=None if self.speculator is None else self.speculator.stats,
        )

    def get_info(self) -> EngineInfo:
        """What this engine loaded (model, weight format, dtype, device, KV pool, draft, bytes
        allocated: counted now, one walk over the model's tensors)."""
        spec = self.config.speculative
        draft = None
        if self.speculator is not None:
            draft = "ngram" if spec.method == "ngram" else Path(spec.draft_model).name
        return EngineInfo(
            model=self.model_name, weight_format=self._weight_format, dtype=self.dtype,
            device=self.device, max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            block_size=self.config.cache.block_size, kv_cache_bytes=self._kv_cache_bytes,
            quant_group_size=self._group_size,
            draft=draft,
            num_spec_tokens=0 if draft is None
            else self.config.speculative.num_speculative_tokens,
            allocated_bytes=allocated_bytes(module_tensors(self.runner.model)
                                            + list(self.runner.kv_caches)
                                            + self._draft_tensors()))

    def draft_model(self):
        """``(model, kv_caches, block_size)`` of the draft model speculation runs, or None
        (no speculation, or prompt lookup: no draft model)."""
        proposer = getattr(self.speculator, "proposer", None)
        if getattr(proposer, "model", None) is None:
            return None
        return proposer.model, proposer.kv_caches, proposer.block_size

    def _draft_tensors(self) -> list:
        """The draft model's tensors and KV pool (none without a draft model)."""
        draft = self.draft_model()
        return [] if draft is None else module_tensors(draft[0]) + list(draft[1])

    def memory_report(self) -> MemoryReport:
        """The planner's prediction for this engine as loaded beside a measurement
        (``memory.report.memory_report``). Raises ``ValueError`` for a dtype the planner
        does not know."""
        return memory_report(self)

    def request_ids(self) -> list[str]:
        """Ids of the requests queued or running (not finished, not aborted)."""
        return list(self.scheduler.requests)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use stay)."""
        self.kv_cache_manager.reset_prefix_cache()

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, and report each request that progressed.

        An automatically fp32 CPU engine (``self.a8_fp32``) decodes through the integer-dot
        kernels, but a step that computes prompt tokens runs every row on the exact ones
        (``computes_prompt``): a prompt's KV then has the same values whether 5 or 37 of its
        tokens are computed, so a prefix-cache hit changes no answer."""
        with kernels.a8_fp32() if self.a8_fp32 else contextlib.nullcontext():
            return self._step()

    def _step(self) -> list[RequestOutput]:
        spec = self.speculator
        drafts = draft_probs = None
        if spec is not None:
            running = self.scheduler.running
            drafts = spec.propose(running,
                                  {r.request_id: self.runner.generator(r) for r in running})
            draft_probs = spec.draft_probs
        sched = self.scheduler.schedule(drafts)
        if sched.is_empty:
            return []
        t0 = time.perf_counter()
        with kernels.a8_fp32(enabled=False) if self.a8_fp32 and computes_prompt(sched) \
                else contextlib.nullcontext():
            result = self.runner.execute_model(sched, draft_probs)
        target_time = time.perf_counter() - t0
        touched = self.scheduler.update_from_output(sched, result)
        if spec is not None:
            spec.finish_step(sched, result, target_time)
        return [self._make_output(req) for req in touched]

    def _make_output(self, req: Request) -> RequestOutput:
        """Detokenize ``req``'s new token, apply stop strings, build its ``RequestOutput``.

        A stop string in the text finishes the request here (``FinishReason.STOP``,
        ``stop_reason`` = the string, blocks freed); ``text`` never contains a stop string and
        the deltas concatenated equal the final ``text``.
        """
        detok = self._detoks[req.request_id]
        new_ids = req.output_token_ids[len(req.output_token_ids) - req.num_new_tokens:]
        # Stop tokens end the reply; they are not part of its text.
        visible = [t for t in new_ids if t not in req.stop_token_ids]
        delta = detok.step(visible)
        if not req.is_finished and detok.stop_matched is not None:
            # A stop string ended the text: no more tokens for this request.
            self.scheduler.finish(req, FinishReason.STOP)
        if req.is_finished:
            # A reply cut by a token limit or an abort may end inside a character: drop it.
            delta += detok.flush(drop_incomplete=req.finish_reason is not FinishReason.STOP)
            if detok.stop_matched is not None:
                # The text ends at a stop string (maybe resolved only by the flush, or seen
                # before the stop token that ended generation): report the string.
                self.scheduler.stop_at_string(req, detok.stop_matched)
            self._detoks.pop(req.request_id, None)
            self._release(req.request_id)
        return self._output(req, new_ids, delta, detok.text)

    @staticmethod
    def _output(req: Request, new_ids: list[int], delta: str, text: str) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            text_delta=delta,
            text=text,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=len(req.output_token_ids),
            finished=req.is_finished,
            finish_reason=req.finish_reason,
            metrics=RequestMetrics(
                req.arrival_time, req.first_scheduled_time, req.first_token_time,
                req.last_token_time, req.num_prompt_tokens, req.num_cached_tokens,
                len(req.output_token_ids), req.num_draft_tokens, req.num_accepted_tokens),
            output_token_ids=list(req.output_token_ids),
            stop_reason=req.stop_reason,
            num_cached_tokens=req.num_cached_tokens,
            logprobs=(req.output_logprobs[len(req.output_logprobs) - len(new_ids):]
                      if req.sampling_params.logprobs is not None else None),
        )

    def generate(self, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 request_id: str | None = None) -> Iterator[RequestOutput]:
        """Stream one request's outputs, stepping the engine until it finishes.

        Closing the iterator early (``break``, Ctrl+C) aborts the request and frees its
        blocks. Other queued requests also advance while this one runs.
        """
        rid = self.add_request(request_id, prompt_token_ids, sampling_params)
        finished = False
        try:
            while not finished:
                for out in self.step():
                    if out.request_id == rid:
                        finished = out.finished
                        yield out
        finally:
            if not finished:
                self.abort_request(rid)


def computes_prompt(sched: SchedulerOutput) -> bool:
    """Whether step ``sched`` computes tokens that are not the last sampled one of their
    request: a prompt, or its uncached tail after a prefix-cache hit, even a single token
    (``num_computed_tokens < num_prompt_tokens``), or tokens recomputed after a preemption.
    A decode row (with or without draft tokens to verify) has
    ``num_computed_tokens == num_tokens - 1``."""
    return any(r.num_computed_tokens < max(r.num_prompt_tokens, r.num_tokens - 1)
               for r in sched.scheduled)


__all__ = ["FinishReason", "LLMEngine", "computes_prompt"]
