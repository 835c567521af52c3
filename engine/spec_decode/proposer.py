"""The draft model: proposes k tokens per decoding request from its own paged KV cache.

The draft runs beside the target with its own ``KVCacheManager`` (prefix caching on), so a
conversation's earlier turns are cached for the draft too. Each request has a shadow
``Request`` on the draft side that shares the target request's prompt and output token lists
(the verified tokens) but keeps its own ``num_computed_tokens``, blocks and block hashes.

One ``propose`` call runs k draft forward passes for all requests at once: the first catches
the draft up on every verified token it has not seen (after a prefill or an earlier rejection,
possibly many) and yields draft token 1; each later pass feeds the previous draft token.
Blocks are hashed only over verified tokens (``allocate_slots`` caps caching at the shadow's
known tokens), and ``rollback`` rewinds the draft to the tokens the target accepted, so a
rejected draft leaves no trace in the draft's cache. Reference design: vLLM's draft-model
proposer (``vllm/v1/spec_decode``), reduced to one process and one device.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat import kernels

from ..kv_cache import KVCacheManager
from ..request import Request
from ..sampler import apply_penalties_after_drafts, exponential_race, row_argmax, sampling_probs
from ..step_inputs import BatchEntry, StagingBuffers, flatten_batch


class DraftModelProposer:
    """Proposes draft tokens for running requests.

    Args:
        model: the draft ``nn.Module`` (``forward(input_ids, positions, kv_caches, meta)``,
            ``compute_logits``).
        kv_caches: the draft's per-layer ``[2, num_blocks, block_size, num_kv_heads,
            head_dim]`` tensors.
        num_blocks, block_size: the draft's KV pool geometry.
        device: where the draft runs.
        enable_prefix_caching: reuse the draft's cached blocks across requests.
        vocab_size: the draft's vocabulary (tokens): only the first ``vocab_size`` token ids
            are drafted, their logits alone computed (``compute_logits(vocab_size=...)``;
            ``SpeculativeConfig.draft_vocab_size``); None: all of them.
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], num_blocks: int,
                 block_size: int, device: torch.device, enable_prefix_caching: bool = True,
                 vocab_size: int | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.kv = KVCacheManager(num_blocks, block_size, enable_caching=enable_prefix_caching)
        self.staging = StagingBuffers(device)
        self._shadows: dict[str, Request] = {}
        # request id -> ``[k, vocab]`` fp32 distributions of the latest ``propose``'s drafts
        # (sampled requests only), read by the rejection step through the engine.
        self.draft_probs: dict[str, torch.Tensor] = {}
        # the most tokens one request fed in the latest ``propose``'s first pass (1 to k + 1
        # after a verification; a whole prompt when the draft first sees a request)
        self.last_catch_up = 0

    def _shadow(self, req: Request) -> Request:
        shadow = self._shadows.get(req.request_id)
        if shadow is None:
            shadow = Request(req.request_id, req.prompt_token_ids, req.sampling_params,
                             output_token_ids=req.output_token_ids)
            self._shadows[req.request_id] = shadow
        return shadow

    @torch.inference_mode()
    @kernels.inexact_prompts()  # a catch-up's short prefill may take the integer-dot kernels
    def propose(self, requests: list[Request], num_spec_tokens: dict[str, int],
                generators: dict[str, torch.Generator | None]) -> dict[str, list[int]]:
        """Draft for each request in decode state (all but its last token computed by the
        target) with ``num_spec_tokens[req_id] = k > 0``; returns request id -> k draft token
        ids (requests with drafts only). When sampling, the distributions the drafts were
        drawn from are kept in ``self.draft_probs[req_id]`` (``[k, vocab]`` fp32) until the
        next call. A request the draft's pool cannot hold gets no drafts this step. Target
        requests are only read.
        """
        self.draft_probs = {}
        self.last_catch_up = 0
        proposed: dict[str, list[int]] = {}
        active: list[tuple[Request, Request, int]] = []
        for req in requests:
            k = num_spec_tokens.get(req.request_id, 0)
            if k <= 0 or req.num_computed_tokens != req.num_tokens - 1:
                continue
            shadow = self._shadow(req)
            hits, num_hit = self.kv.get_computed_blocks(shadow)
            new = req.num_tokens - shadow.num_computed_tokens - num_hit
            if new < 1 or not self.kv.allocate_slots(shadow, new, k - 1,
                                                      new_computed_blocks=hits):
                self.free(req.request_id)
                continue
            shadow.num_computed_tokens += num_hit
            active.append((req, shadow, k))
        if not active:
            return proposed
        # Draft tokens stay on the device (0-d int64 tensors) and feed the next round
        # directly: no per-token sync. Only requests with penalties (which need the drafts'
        # ids on the host) read each token back. One read of every draft at the end.
        drafts: dict[str, list[torch.Tensor]] = {req.request_id: [] for req, _, _ in active}
        host_drafts: dict[str, list[int]] = {req.request_id: [] for req, _, _ in active}
        probs: dict[str, list[torch.Tensor]] = {req.request_id: [] for req, _, _ in active}
        round_ = [(req, shadow, k) for req, shadow, k in active]
        self.last_catch_up = max(req.num_tokens - shadow.num_computed_tokens
                                 for req, shadow, _ in active)
        first = True
        while round_:
            entries = []
            for req, shadow, _ in round_:
                start = shadow.num_computed_tokens
                ids = req.token_ids(start, req.num_tokens) if first else [0]
                entries.append(BatchEntry(shadow.block_ids, start, ids, "last"))
            hb = flatten_batch(entries, self.block_size)
            rows = [g[0] for g in hb.row_groups]
            input_ids, positions, meta, index = self.staging.to_device(
                hb, rows if first else None)
            if not first:  # one token per request: its previous draft, still on the device
                input_ids = torch.stack([drafts[req.request_id][-1] for req, _, _ in round_])
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
            picked = hidden[index] if first else hidden[: len(round_)]
            # one integer-dot pass where the target's output layer takes two, over the draft's
            # vocabulary: a draft's logits only pick the proposals, the target verifies each
            logits = self.model.compute_logits(picked, draft=True,
                                               vocab_size=self.vocab_size).float()
            for i, (req, shadow, _) in enumerate(round_):
                shadow.num_computed_tokens += len(entries[i].token_ids)
                token, p = self._sample(logits[i], req, host_drafts[req.request_id],
                                        generators.get(req.request_id))
                drafts[req.request_id].append(token)
                if p is not None:
                    probs[req.request_id].append(p)
            first = False
            round_ = [(r, s, k) for r, s, k in round_ if len(drafts[r.request_id]) < k]
        flat = torch.stack([t for req, _, _ in active for t in drafts[req.request_id]])
        values = flat.tolist()  # the one device-to-host read of the draft
        offset = 0
        for req, _, _ in active:
            n = len(drafts[req.request_id])
            proposed[req.request_id] = values[offset: offset + n]
            offset += n
            if probs[req.request_id]:
                self.draft_probs[req.request_id] = torch.stack(probs[req.request_id])
        return proposed

    def _sample(self, logits: torch.Tensor, req: Request, host_drafts: list[int],
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token (a 0-d int64 device tensor) from ``logits [vocab]`` with the
        request's sampling params, and its distribution ``[vocab]`` when sampling. With a
        penalty the drafts so far count as output; they are kept on the host in
        ``host_drafts`` (appended here: the only per-token read, penalties only)."""
        params = req.sampling_params
        penalized = params.uses_repetition_penalty or params.uses_output_penalty
        row = apply_penalties_after_drafts(logits[None], params, req.prompt_token_ids,
                                           req.output_token_ids, host_drafts)
        p = None
        if params.greedy:
            token = row_argmax(row)[0]
        else:
            p = sampling_probs(row, [params])
            token = exponential_race(p, generator)[0]
            p = p[0]
        if penalized:
            host_drafts.append(int(token))
        return token, p

    def rollback(self, req: Request) -> None:
        """After verification: keep only draft K/V for tokens the target accepted
        (``req.num_computed_tokens``), release blocks past them."""
        shadow = self._shadows.get(req.request_id)
        if shadow is None:
            return
        keep = min(shadow.num_computed_tokens, req.num_computed_tokens)
        shadow.num_computed_tokens = keep
        self.kv.truncate(shadow, keep)

    def free(self, request_id: str) -> None:
        """Forget a request (finished, aborted, or not holdable); its cached blocks stay
        reusable for later requests with the same prefix."""
        shadow = self._shadows.pop(request_id, None)
        if shadow is not None:
            self.kv.free(shadow)
            shadow.num_computed_tokens = 0
