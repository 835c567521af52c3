"""Verification of draft tokens: speculative sampling that preserves the target distribution.

Leviathan et al. 2023 (arXiv 2211.17192) and Chen et al. 2023 (arXiv 2302.01318): draft token
``x_i ~ q_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first
rejection the emitted token is drawn from the residual ``norm(max(0, p_i - q_i))``; when all k
drafts are accepted a bonus token is drawn from ``p_{k+1}``. The emitted sequence then follows
the target's distribution exactly. At temperature 0 (greedy) drafts are accepted while they
equal the target's argmax and the target's argmax is emitted after them, so the output is
token for token what the target alone would produce.

``p_i`` is the target's *sampling* distribution at position i: the same penalties (with the
drafts before position i counted as output), temperature, top-k, top-p and min-p as plain
sampling (``sampler.sampling_probs``). The draft shapes ``q_i`` with the same parameters.
"""

from __future__ import annotations

import torch

from ..request import Request
from ..sampler import (
    apply_penalties_after_drafts,
    exponential_race,
    row_argmax,
    row_values,
    sampling_probs,
)


def _categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs [B, V]`` (``sampler.exponential_race``, one generator)."""
    return exponential_race(probs, generator)


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     draft_token_ids: torch.Tensor, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling for a batch of ``B`` rows with ``k`` drafts each.

    Args:
        target_probs: ``[B, k + 1, V]`` fp32, the target's distribution at each draft
            position and after the last draft.
        draft_probs: ``[B, k, V]`` fp32, the distributions the drafts were sampled from.
        draft_token_ids: ``[B, k]`` int64.
        generator: RNG for the acceptance tests and the residual / bonus draws.

    Returns:
        ``(num_accepted [B] int64 in [0, k], next_token_ids [B] int64)``: the accepted drafts
        are ``draft_token_ids[b, :num_accepted[b]]``, followed by ``next_token_ids[b]``
        (drawn from the residual at the first rejection, or the bonus from ``p_{k+1}``).
    """
    b, k = draft_token_ids.shape
    rows = torch.arange(b, device=target_probs.device)
    p_d = target_probs[:, :k].gather(-1, draft_token_ids[..., None])[..., 0]
    q_d = draft_probs.gather(-1, draft_token_ids[..., None])[..., 0]
    u = torch.rand(b, k, generator=generator, device=target_probs.device)
    rejected = u * q_d >= p_d  # accept iff u < p / q (q > 0: the draft sampled the token)
    num_accepted = torch.where(rejected.any(dim=1), rejected.int().argmax(dim=1),
                               torch.full((b,), k, device=rejected.device))
    p_at = target_probs[rows, num_accepted]
    was_rejected = (num_accepted < k)[:, None]
    q_at = draft_probs[rows, num_accepted.clamp(max=k - 1)] * was_rejected
    residual = (p_at - q_at).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    # p == q leaves no residual mass (a rejection is then impossible): fall back to p.
    dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_at)
    return num_accepted, _categorical(dist, generator)


def accept_greedy(draft_token_ids: list[int], target_token_ids: list[int]) -> list[int]:
    """Greedy verification: the drafts up to the first that differs from the target's argmax
    at its position, then the target's token there. ``target_token_ids``: the target's
    argmax at each of the ``k + 1`` positions (k = ``len(draft_token_ids)``). Returns 1 to
    k + 1 ids."""
    accepted = 0
    k = len(draft_token_ids)
    while accepted < k and draft_token_ids[accepted] == target_token_ids[accepted]:
        accepted += 1
    return draft_token_ids[:accepted] + [target_token_ids[accepted]]


class RejectionSampler:
    """Verifies one request's drafts against the target's logits (see the module docstring).

    ``verify(target_logits [k + 1, V] fp32, draft_token_ids (k ids), draft_probs [k, V] fp32
    or None when greedy, request, generator) -> emitted token ids`` (accepted drafts, then one
    target token; 1 to k + 1 ids). ``request.output_token_ids`` must not yet include them.
    """

    def verify(self, target_logits: torch.Tensor, draft_token_ids: list[int],
               draft_probs: torch.Tensor | None, request: Request,
               generator: torch.Generator | None) -> list[int]:
        params = request.sampling_params
        k = len(draft_token_ids)
        logits = apply_penalties_after_drafts(target_logits.float(), params,
                                              request.prompt_token_ids,
                                              request.output_token_ids, draft_token_ids)
        if params.greedy or draft_probs is None:
            return accept_greedy(draft_token_ids, row_argmax(logits).tolist())
        probs = sampling_probs(logits, [params] * (k + 1))
        ids = row_values(draft_token_ids, torch.int64, probs.device)[None]
        q = draft_probs[None].to(probs.device, non_blocking=True)  # already there on CUDA
        n, nxt = rejection_sample(probs[None], q, ids, generator)
        a, token = torch.stack([n[0], nxt[0]]).tolist()  # this request's one device read
        return draft_token_ids[:a] + [token]
