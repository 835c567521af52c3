"""Logits -> token ids for the whole batch in one call.

Greedy rows take the exact argmax. Other rows apply temperature, then top-k and top-p
(nucleus, Holtzman et al. 2019) filtering, then draw from the softmax: seeded requests with
their own ``torch.Generator`` (so a seed reproduces whatever else is in the batch), the rest by
the exponential-race trick (argmax of ``probs / Exponential(1)``), which equals a categorical
draw. The full sampling issue extends this (min-p, penalties, logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    """Per-row sampling settings for a batch of ``num_seqs`` logit rows.

    ``generators`` holds one ``torch.Generator`` (or ``None``) per row.
    """

    params: list[SamplingParams]
    generators: list[torch.Generator | None]

    @property
    def all_greedy(self) -> bool:
        return all(p.greedy for p in self.params)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Mask (``-inf``) everything outside top-k and the top-p nucleus, row-wise.

    ``logits [n, vocab]`` fp32, ``top_k [n]`` int64 (0 = off), ``top_p [n]`` fp32 (1 = off).
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    remove = ranks >= k[:, None]
    # top-p acts on the distribution left by top-k, renormalized (transformers / vLLM order).
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    cum_before = probs.cumsum(dim=-1) - probs  # mass strictly above this token
    # Rows with top_p == 1 are untouched: an fp32 cumsum can overshoot 1 on a large vocab.
    remove |= (cum_before > top_p[:, None]) & (top_p < 1)[:, None]
    remove[:, 0] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


class Sampler:
    """``sample(logits [num_seqs, vocab] fp32, metadata) -> [num_seqs] int64 token ids``."""

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        greedy_tokens = logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy_tokens
        device = logits.device
        params = metadata.params
        temps = torch.tensor(
            [p.temperature if not p.greedy else 1.0 for p in params], device=device
        )
        # Subtract the row max before dividing: the top logit becomes exactly 0 and the rest
        # go to (at worst) -inf, so any temperature > 0, however tiny, stays NaN-free and a
        # tiny one concentrates all mass on the argmax (no clamp that would flatten gaps).
        shifted = logits - logits.max(dim=-1, keepdim=True).values
        tiny = torch.finfo(torch.float32).tiny
        scaled = shifted / temps.clamp_min(tiny)[:, None]
        top_k = torch.tensor([p.top_k for p in params], device=device, dtype=torch.int64)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            scaled = _filter_top_k_top_p(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for i, gen in enumerate(metadata.generators):
            noise[i].exponential_(generator=gen)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.greedy for p in params], device=device)
        return torch.where(is_greedy, greedy_tokens, sampled)
