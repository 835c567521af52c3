"""SchedulerOutput -> flattened tensors -> model -> logits -> sampled tokens.

The batch is flattened (vLLM style): ``input_ids [num_tokens]`` and ``positions [num_tokens]``
concatenate every scheduled request's new tokens; ``AttentionMetadata`` says where they go in
the paged cache. Logits are computed only for the last row of requests that sample this step
(those whose prompt is now fully computed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from localchat import kernels

from .cuda_graphs import DEFAULT_BATCH_SIZES
from .outputs import ModelRunnerOutput
from .request import Request
from .sampler import Sampler, SamplingMetadata
from .scheduler import SchedulerOutput
from .spec_decode.rejection_sampler import RejectionSampler, accept_greedy
from .step_inputs import BatchEntry, HostBatch, StagingBuffers, flatten_batch

logger = logging.getLogger(__name__)


def check_first_logits(logits: torch.Tensor, cache_entry=None) -> None:
    """Raise ``ModelLoadError`` when a row of the first forward's logits ``[num_rows, vocab]``
    has no finite value: the model cannot answer (weights that overflow, a broken kernel), and
    sampling would emit token 0 forever. ``cache_entry``: the quantized-weight cache file the
    weights were mapped from, if any (named in the message: a damaged entry is read again on
    every load until it is deleted). One device sync, on the first step only."""
    if not bool(torch.isfinite(logits).any(dim=-1).all()):
        from .errors import ModelLoadError

        hint = "--quant none, or check the model file" if cache_entry is None else \
            f"deleting the cached weights {cache_entry}, rebuilt on the next load"
        raise ModelLoadError("the model's first forward pass gave NaN/Inf logits for every "
                             f"token: its weights or this device's kernels are broken (try "
                             f"{hint})")


class ModelRunner:
    """Owns the model, its per-layer KV cache tensors and the per-request RNGs.

    ``kv_caches``: list of ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensors.
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device, step_groups: bool = False) -> None:
        self.model = model
        # split a CPU step into forwards that each compute what their requests would alone
        # (step_groups; LLMEngine sets it with SchedulerConfig.batch_invariant)
        self.split_steps = step_groups and torch.device(device).type == "cpu"
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler()
        self.first_logits_checked = False  # check_first_logits runs on the first step only
        # CUDA graphs for decode batches (engine/cuda_graphs.py), captured by
        # ``capture_cuda_graphs``; None on CPU or before capture.
        self.graphs = None
        # The step's input tensors: on CPU views of persistent ring buffers, rebuilt only
        # when the batch layout changes (``StagingBuffers.to_device``).
        self.staging = StagingBuffers(device, persistent=True)
        self._generators: dict[str, torch.Generator] = {}

    def capture_cuda_graphs(self, max_model_len: int,
                            batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES) -> str | None:
        """On CUDA, capture the model's decode step for ``batch_sizes`` sequences (default
        ``cuda_graphs.DEFAULT_BATCH_SIZES``; pure decode steps then replay a graph; other
        shapes run eagerly). Returns ``None`` when captured, else why not: off CUDA,
        ``LOCALCHAT_CUDA_GRAPHS=0``, or when an op would not be graph-safe
        (``cuda_graphs.graph_unsafe_reason``: the PyTorch reference kernels read device values
        on the host). The KV cache tensors must not be reallocated after."""
        import os

        if self.device.type != "cuda":
            return "not a CUDA device"
        if os.environ.get("LOCALCHAT_CUDA_GRAPHS") == "0":
            return "LOCALCHAT_CUDA_GRAPHS=0"
        from .cuda_graphs import CudaGraphRunner, graph_unsafe_reason

        reason = graph_unsafe_reason(self.model)
        if reason is not None:
            logger.info("CUDA graphs off: %s", reason)
            return reason
        self.graphs = CudaGraphRunner(
            self.model, self.kv_caches,
            max_num_blocks_per_seq=-(-max_model_len // self.block_size),
            batch_sizes=batch_sizes, device=self.device)
        self.graphs.capture()
        return None

    def _forward(self, hb: HostBatch, logits_rows: list[int]):
        """``(hidden [T or padded, hidden_size], logits_index [len(logits_rows)] | None)``
        for one step: a graph replay when the step fits one (its rows are a view into a
        static buffer: use them before the next forward), else the eager model; either way
        one packed host-to-device copy. ``logits_index`` is ``None`` when the rows are
        ``0 .. len(logits_rows) - 1`` (slice ``hidden`` instead)."""
        contiguous = logits_rows == list(range(len(logits_rows)))
        rows = None if contiguous else logits_rows
        if self.graphs is not None and self.graphs.can_replay_batch(hb):
            return self.graphs.replay_batch(hb, self.staging, rows)
        input_ids, positions, meta, index = self.staging.to_device(hb, rows)
        if self.graphs is not None:
            return self.graphs.forward(input_ids, positions, meta), index
        return self.model(input_ids, positions, self.kv_caches, meta), index

    def release(self, request_id: str) -> None:
        """Forget a finished request's RNG."""
        self._generators.pop(request_id, None)

    def generator(self, req: Request) -> torch.Generator | None:
        """The request's seeded RNG (``None`` when unseeded or greedy), created on first use;
        the draft proposer draws from it too, so a seed reproduces a speculative run."""
        seed = req.sampling_params.seed
        if seed is None or req.sampling_params.greedy:
            return None
        gen = self._generators.get(req.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[req.request_id] = gen
        return gen

    def plan_step(self, out: SchedulerOutput):
        """``(HostBatch, logits_rows, samplers, verify)`` for one step, on the host:
        ``logits_rows`` are the flat rows to sample, ``samplers`` their requests, and
        ``verify`` lists ``(request, rows)`` for requests verifying draft tokens
        (``out.scheduled_spec_decode_tokens``; a logits row at each of their ``1 + k`` positions)."""
        entries = []
        for req in out.scheduled:
            n = out.num_scheduled_tokens[req.request_id]
            spec = out.scheduled_spec_decode_tokens.get(req.request_id, [])
            start = req.num_computed_tokens
            ids = req.token_ids(start, start + n - len(spec)) + spec
            if spec:
                rows = "all"
            else:
                rows = "last" if start + n == req.num_tokens else "none"
            entries.append(BatchEntry(req.block_ids, start, ids, rows))
        hb = flatten_batch(entries, self.block_size)
        logits_rows, samplers, verify = [], [], []
        for req, rows in zip(out.scheduled, hb.row_groups):
            if req.request_id in out.scheduled_spec_decode_tokens:
                verify.append((req, rows))
            elif rows:
                logits_rows.extend(rows)
                samplers.append(req)
        return hb, logits_rows, samplers, verify

    def prepare_inputs(self, out: SchedulerOutput):
        """Device tensors of one step: ``(input_ids [T], positions [T], AttentionMetadata,
        logits_rows, samplers, row_groups)`` (see :meth:`plan_step`; ``row_groups[i]`` are
        the rows of scheduled request ``i`` that need logits)."""
        hb, logits_rows, samplers, _ = self.plan_step(out)
        input_ids, positions, meta, _ = self.staging.to_device(hb)
        return input_ids, positions, meta, logits_rows, samplers, hb.row_groups

    def step_groups(self, out: SchedulerOutput) -> list[SchedulerOutput]:
        """The forwards one step runs: ``[out]``, or with ``step_groups`` (a CPU runner of a
        batch-invariant engine), where the step has more than ``kernels.CPU_MAX_ROWS`` rows,
        consecutive runs of its requests that each compute what they would alone. A CPU
        forward of at most that many rows takes the row kernels (each row the same bits
        whatever its batchmates: ``tests/kernels``), a longer one the prompt GEMM over
        dequantized weights and SDPA, whose rows round otherwise: so a request of more rows
        computes alone (``_forward_groups`` runs such requests a layer at a time), and
        requests of fewer are packed up to that many rows. Six copies of one greedy request
        sent to ``serve`` at once, each 3 prompt tokens after 32 cached ones, took the GEMM
        together (18 rows) and the row kernels alone, and four of six replies differed from
        the lone one."""
        cap = kernels.CPU_MAX_ROWS
        if not self.split_steps or out.total_num_scheduled_tokens <= cap:
            return [out]
        groups: list[SchedulerOutput] = []
        rows = cap + 1  # the current group's rows (none open yet)
        for req in out.scheduled:
            rid = req.request_id
            n = out.num_scheduled_tokens[rid]
            if n > cap or rows + n > cap:
                groups.append(SchedulerOutput())
                rows = 0
            group = groups[-1]
            group.scheduled.append(req)
            group.num_scheduled_tokens[rid] = n
            if rid in out.scheduled_spec_decode_tokens:
                group.scheduled_spec_decode_tokens[rid] = out.scheduled_spec_decode_tokens[rid]
            rows = n if n > cap else rows + n
        return groups

    def _forward_groups(self, groups: list[SchedulerOutput]):
        """:meth:`plan_step` and a forward for each of ``groups`` (eager CPU forwards): one
        :meth:`_forward` each for groups of at most ``kernels.CPU_MAX_ROWS`` rows (the row
        kernels), one ``model.forward_groups`` for the longer ones together (a layer at a
        time, each weight dequantized once for all of them). Returns ``(hidden, logits_rows,
        samplers, verify)`` where ``hidden`` holds the sampled rows of every group (in
        ``samplers`` order), then the verification rows (in ``verify`` order), and each
        ``logits_rows`` / ``verify`` entry indexes it."""
        planned = [self.plan_step(group) for group in groups]
        picked: list[torch.Tensor | None] = [None] * len(groups)
        together = hasattr(self.model, "forward_groups")
        pending: list[tuple[int, list[int]]] = []  # consecutive long groups, run together

        def run_pending() -> None:
            batches = [StagingBuffers(self.device, slots=1).to_device(planned[i][0])[:3]
                       for i, _ in pending]
            for (i, wanted), hidden in zip(pending,
                                           self.model.forward_groups(batches, self.kv_caches)):
                picked[i] = hidden[torch.tensor(wanted, dtype=torch.long)]
            pending.clear()

        # in order: a group may read KV blocks an earlier one writes in this step (a prompt
        # whose prefix-cache hit is another prompt of the same step)
        for i, (hb, rows, _, group_verify) in enumerate(planned):
            wanted = rows + [r for _, rws in group_verify for r in rws]
            if together and len(hb.input_ids) > kernels.CPU_MAX_ROWS:
                pending.append((i, wanted))
                continue
            if pending:
                run_pending()
            hidden, index = self._forward(hb, wanted)
            picked[i] = hidden[:len(wanted)] if index is None else hidden[index]
        if pending:
            run_pending()
        sampled, verified, samplers, verify = [], [], [], []
        for (_, rows, group_samplers, group_verify), rows_of in zip(planned, picked):
            sampled.append(rows_of[:len(rows)])
            verified.append(rows_of[len(rows):])
            samplers += group_samplers
            verify += group_verify
        hidden = torch.cat(sampled + verified)
        num_sampled = sum(h.shape[0] for h in sampled)
        offset, flat_verify = num_sampled, []
        for req, rws in verify:
            flat_verify.append((req, list(range(offset, offset + len(rws)))))
            offset += len(rws)
        return hidden, list(range(num_sampled)), samplers, flat_verify

    def _rows(self, fn, hidden: torch.Tensor) -> torch.Tensor:
        """``fn`` (the model's ``compute_logits`` or ``greedy_token_ids``) over ``hidden``;
        with ``step_groups`` in calls of at most ``kernels.CPU_MAX_ROWS`` rows: the output
        layer's row kernels give each row the bits it gets alone (a longer call would take
        its GEMM)."""
        if not self.split_steps or hidden.shape[0] <= kernels.CPU_MAX_ROWS:
            return fn(hidden)
        return torch.cat([fn(part) for part in hidden.split(kernels.CPU_MAX_ROWS)])

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput,
                      draft_probs: Mapping[str, torch.Tensor] | None = None
                      ) -> ModelRunnerOutput:
        """Run one step and return what it sampled (``ModelRunnerOutput``; no ``Request`` is
        modified here): for each request that samples, one token, or for a request verifying
        k draft tokens (``out.scheduled_spec_decode_tokens``) the accepted drafts plus one
        target token (``RejectionSampler``). ``draft_probs``: request id -> the ``[k, vocab]``
        fp32 distributions its drafts were sampled from (the proposer's; absent when greedy).

        Requests with ``sampling_params.logprobs is not None`` also get one
        ``{token_id: logprob}`` dict per sampled token (see ``engine.sampler`` for which
        distribution).

        Host work: one packed host-to-device copy of the step's inputs (or of a graph's
        static inputs), logits only for the needed rows (indexed on the device), and one
        device-to-host read of the sampled tokens (the step's one sync, when no request asks
        for logprobs or penalties).
        """
        groups = self.step_groups(out)
        if len(groups) == 1:
            hb, rows, samplers, verify = self.plan_step(out)
            flat = [i for _, rws in verify for i in rws]
            hidden, index = self._forward(hb, rows + flat)
        else:
            hidden, rows, samplers, verify = self._forward_groups(groups)
            flat, index = [i for _, rws in verify for i in rws], None
        result = ModelRunnerOutput()
        if not rows and not flat:
            return result
        def pick(lo: int, hi: int) -> torch.Tensor:  # hidden rows of logits_rows[lo:hi]
            return hidden[lo:hi] if index is None else hidden[index[lo:hi]]

        if rows:
            if self.first_logits_checked and all(r.sampling_params.plain_greedy
                                                 for r in samplers):
                # the argmax alone (model.greedy_token_ids: on CPU the output layer's one
                # integer-dot pass with exact rescoring)
                tokens = self._rows(self.model.greedy_token_ids, pick(0, len(rows))).tolist()
            else:
                logits = self._rows(self.model.compute_logits, pick(0, len(rows)))
                if not self.first_logits_checked:
                    check_first_logits(logits, getattr(self.model, "quant_cache_entry", None))
                    self.first_logits_checked = True
                metadata = self.sampling_metadata(samplers)
                sampled = self.sampler.forward(logits, metadata)
                for req, lp in zip(samplers, sampled.logprobs):
                    if lp is not None:
                        result.logprobs[req.request_id] = [lp]
                tokens = sampled.token_ids.tolist()
            for r, t in zip(samplers, tokens):
                result.sampled_token_ids[r.request_id] = [t]
        if verify and all(req.sampling_params.plain_greedy for req, _ in verify):
            # the same per-row argmax as plain decoding: drafts change no greedy token
            target = self._rows(self.model.greedy_token_ids,
                                pick(len(rows), len(rows) + len(flat))).tolist()
            offset = 0
            for req, rws in verify:
                rid = req.request_id
                spec = out.scheduled_spec_decode_tokens[rid]
                tokens = accept_greedy(spec, target[offset: offset + len(spec) + 1])
                offset += len(rws)
                result.sampled_token_ids[rid] = tokens
                result.num_accepted_tokens[rid] = len(tokens) - 1
        elif verify:
            logits = self._rows(self.model.compute_logits, pick(len(rows), len(rows) + len(flat)))
            offset = 0
            probs = draft_probs or {}
            for req, rws in verify:
                rid = req.request_id
                spec = out.scheduled_spec_decode_tokens[rid]
                target_logits = logits[offset: offset + len(rws)]
                offset += len(rws)
                # The budget may have cut the drafts short: their distributions too.
                q = probs.get(rid)
                tokens = self.rejection_sampler.verify(
                    target_logits, spec, None if q is None else q[:len(spec)], req,
                    self.generator(req))
                result.sampled_token_ids[rid] = tokens
                result.num_accepted_tokens[rid] = len(tokens) - 1
        return result

    def sampling_metadata(self, samplers: list[Request]) -> SamplingMetadata:
        """``SamplingMetadata`` for the requests sampled this step, one row each.

        Token id lists are passed only when some row has a penalty, and only for the rows
        that need them (the prompt only for ``repetition_penalty``): a batch of defaults
        costs nothing extra.
        """
        params = [r.sampling_params for r in samplers]
        prompt_ids = output_ids = None
        if any(p.uses_repetition_penalty for p in params):
            prompt_ids = [r.prompt_token_ids if r.sampling_params.uses_repetition_penalty
                          else [] for r in samplers]
        if any(p.uses_repetition_penalty or p.uses_output_penalty for p in params):
            output_ids = [r.output_token_ids for r in samplers]
        return SamplingMetadata(
            params=params,
            generators=[self.generator(r) for r in samplers],
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
        )
