"""SchedulerOutput -> flattened tensors -> model -> logits -> sampled tokens.

The batch is flattened (vLLM style): ``input_ids [num_tokens]`` and ``positions [num_tokens]``
concatenate every scheduled request's new tokens; ``AttentionMetadata`` says where they go in
the paged cache. Logits are computed only for the last row of requests that sample this step
(those whose prompt is now fully computed).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention_metadata import AttentionMetadata
from .request import Request
from .sampler import Sampler, SamplingMetadata
from .scheduler import SchedulerOutput


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
        self._generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        """Forget a finished request's RNG."""
        self._generators.pop(request_id, None)

    def _generator(self, req: Request) -> torch.Generator | None:
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
        """Build ``(input_ids [T], positions [T], AttentionMetadata, logits_rows, samplers)``
        where ``logits_rows`` indexes the rows to sample and ``samplers`` lists their
        requests."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        qsl = [0]
        logits_rows: list[int] = []
        samplers: list[Request] = []
        bs = self.block_size
        for req in out.scheduled:
            n = out.num_scheduled_tokens[req.request_id]
            start = req.num_computed_tokens
            end = start + n
            ids.extend(req.token_ids(start, end))
            positions.extend(range(start, end))
            table = req.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            seq_lens.append(end)
            qsl.append(qsl[-1] + n)
            if end == req.num_tokens:
                logits_rows.append(qsl[-1] - 1)
                samplers.append(req)
        max_blocks = max(len(r.block_ids) for r in out.scheduled)
        tables = [r.block_ids + [0] * (max_blocks - len(r.block_ids)) for r in out.scheduled]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int64, device=dev),
            max_query_len=max(out.num_scheduled_tokens.values()),
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            meta,
            logits_rows,
            samplers,
        )

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns ``{request_id: sampled token id}`` for requests that sample.

        Requests with ``sampling_params.logprobs is not None`` also get one
        ``{token_id: logprob}`` dict appended to ``req.output_logprobs`` per sampled token
        (see ``engine.sampler`` for which distribution).
        """
        input_ids, positions, meta, rows, samplers = self.prepare_inputs(out)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not rows:
            return {}
        logits = self.model.compute_logits(hidden[rows])
        metadata = self.sampling_metadata(samplers)
        result = self.sampler.forward(logits, metadata)
        for req, lp in zip(samplers, result.logprobs):
            if lp is not None:
                req.output_logprobs.append(lp)
        tokens = result.token_ids.tolist()
        return {r.request_id: t for r, t in zip(samplers, tokens)}

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
            generators=[self._generator(r) for r in samplers],
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
        )
