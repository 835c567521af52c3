"""SchedulerOutput -> flattened tensors -> model -> logits -> sampled tokens.

The batch is flattened (vLLM style): ``input_ids [num_tokens]`` and ``positions [num_tokens]``
concatenate every scheduled request's new tokens; ``AttentionMetadata`` says where they go in
the paged cache. Logits are computed only for the last row of requests that sample this step
(those whose prompt is now fully computed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .attention_metadata import AttentionMetadata
from .cuda_graphs import DEFAULT_BATCH_SIZES
from .request import Request
from .sampler import Sampler, SamplingMetadata
from .scheduler import SchedulerOutput
from .spec_decode.rejection_sampler import RejectionSampler


@dataclass
class BatchEntry:
    """One sequence's slice of a flattened batch: ``token_ids`` at positions
    ``start, start + 1, ...`` written through ``block_ids``; ``rows``: which of its rows need
    logits ("last", "all" or "none")."""

    block_ids: list[int]
    start: int
    token_ids: list[int]
    rows: str


def build_batch(entries: list[BatchEntry], block_size: int, device: torch.device):
    """Flatten sequences into ``(input_ids [T] int64, positions [T] int64,
    AttentionMetadata, row_groups)``; ``row_groups[i]`` lists the flat rows of entry ``i``
    that need logits. Shared by the target's runner and the draft proposer."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    qsl = [0]
    row_groups: list[list[int]] = []
    bs = block_size
    for e in entries:
        n = len(e.token_ids)
        end = e.start + n
        ids.extend(e.token_ids)
        positions.extend(range(e.start, end))
        table = e.block_ids
        slots.extend(table[p // bs] * bs + p % bs for p in range(e.start, end))
        seq_lens.append(end)
        qsl.append(qsl[-1] + n)
        if e.rows == "all":
            row_groups.append(list(range(qsl[-2], qsl[-1])))
        elif e.rows == "last":
            row_groups.append([qsl[-1] - 1])
        else:
            row_groups.append([])
    max_blocks = max(len(e.block_ids) for e in entries)
    tables = [e.block_ids + [0] * (max_blocks - len(e.block_ids)) for e in entries]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int64, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int64, device=device),
        max_query_len=max(len(e.token_ids) for e in entries),
    )
    return (torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device), meta, row_groups)


class ModelRunner:
    """Owns the model, its per-layer KV cache tensors and the per-request RNGs.

    ``kv_caches``: list of ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` tensors.
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler()
        # CUDA graphs for decode batches (engine/cuda_graphs.py), captured by
        # ``capture_cuda_graphs``; None on CPU or before capture.
        self.graphs = None
        self._generators: dict[str, torch.Generator] = {}

    def capture_cuda_graphs(self, max_model_len: int,
                            batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES) -> None:
        """On CUDA, capture the model's decode step for ``batch_sizes`` sequences (pure
        decode steps then replay a graph; other shapes run eagerly; default
        ``cuda_graphs.DEFAULT_BATCH_SIZES``). No-op elsewhere or when
        ``LOCALCHAT_CUDA_GRAPHS=0``. The KV cache tensors must not be reallocated after."""
        import os

        if self.device.type != "cuda" or os.environ.get("LOCALCHAT_CUDA_GRAPHS") == "0":
            return
        from .cuda_graphs import CudaGraphRunner

        self.graphs = CudaGraphRunner(
            self.model, self.kv_caches,
            max_num_blocks_per_seq=-(-max_model_len // self.block_size),
            batch_sizes=batch_sizes, device=self.device)
        self.graphs.capture()

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        if self.graphs is not None:
            # Rows are a view into a static buffer: use them before the next forward.
            return self.graphs.forward(input_ids, positions, meta)
        return self.model(input_ids, positions, self.kv_caches, meta)

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

    def prepare_inputs(self, out: SchedulerOutput):
        """Build ``(input_ids [T], positions [T], AttentionMetadata, logits_rows, samplers,
        row_groups)`` where ``logits_rows`` indexes the rows to sample, ``samplers`` lists their
        requests and ``row_groups[i]`` the rows of scheduled request ``i`` that need logits. A request verifying draft tokens (``out.scheduled_spec_tokens``) gets a
        logits row at each of its ``1 + k`` positions."""
        entries = []
        for req in out.scheduled:
            n = out.num_scheduled_tokens[req.request_id]
            spec = out.scheduled_spec_tokens.get(req.request_id, [])
            start = req.num_computed_tokens
            ids = req.token_ids(start, start + n - len(spec)) + spec
            if spec:
                rows = "all"
            else:
                rows = "last" if start + n == req.num_tokens else "none"
            entries.append(BatchEntry(req.block_ids, start, ids, rows))
        input_ids, positions, meta, row_groups = build_batch(entries, self.block_size,
                                                             self.device)
        logits_rows, samplers = [], []
        for req, rows in zip(out.scheduled, row_groups):
            if rows and req.request_id not in out.scheduled_spec_tokens:
                logits_rows.extend(rows)
                samplers.append(req)
        return input_ids, positions, meta, logits_rows, samplers, row_groups

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """Run one step; returns ``{request_id: new token ids}`` for requests that sample:
        one token, or for a request verifying k draft tokens the accepted drafts plus one
        target token (``RejectionSampler``).

        Requests with ``sampling_params.logprobs is not None`` also get one
        ``{token_id: logprob}`` dict appended to ``req.output_logprobs`` per sampled token
        (see ``engine.sampler`` for which distribution).
        """
        input_ids, positions, meta, rows, samplers, row_groups = self.prepare_inputs(out)
        hidden = self._forward(input_ids, positions, meta)
        result: dict[str, list[int]] = {}
        if rows:
            logits = self.model.compute_logits(hidden[rows])
            metadata = self.sampling_metadata(samplers)
            sampled = self.sampler.forward(logits, metadata)
            for req, lp in zip(samplers, sampled.logprobs):
                if lp is not None:
                    req.output_logprobs.append(lp)
            for r, t in zip(samplers, sampled.token_ids.tolist()):
                result[r.request_id] = [t]
        if out.scheduled_spec_tokens:
            verify = [(req, rows) for req, rows in zip(out.scheduled, row_groups)
                      if req.request_id in out.scheduled_spec_tokens]
            flat = [i for _, rws in verify for i in rws]
            logits = self.model.compute_logits(hidden[flat])
            offset = 0
            for req, rws in verify:
                spec = out.scheduled_spec_tokens[req.request_id]
                target_logits = logits[offset: offset + len(rws)]
                offset += len(rws)
                # The budget may have cut the drafts short: their distributions too.
                q = None if req.draft_probs is None else req.draft_probs[:len(spec)]
                result[req.request_id] = self.rejection_sampler.verify(
                    target_logits, spec, q, req, self.generator(req))
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
