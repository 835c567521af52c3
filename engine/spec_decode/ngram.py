"""N-gram drafts: prompt lookup decoding, speculation without a draft model.

The tokens after the most recent earlier occurrence of a request's last n tokens (its prompt
and output so far) are proposed as its next tokens, for the longest n from
:data:`MAX_NGRAM` down to :data:`MIN_NGRAM` that occurs. Replies that copy their input (code
edits, reviews quoting the diff, extraction, a rewrite of a paragraph) accept long runs of such
drafts; other text rarely matches, and then nothing is proposed and the step is a plain one.
A draft costs a search over the token ids, no forward pass, so the verification is the whole
cost. Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding);
vLLM's ``ngram`` speculative method and llama.cpp's lookup decoding do the same.

For sampled requests the draft distribution is the one-hot of each drafted token (the
proposer is deterministic), so ``rejection_sampler`` accepts a draft with the target's
probability of it and, at a rejection, draws from the target's distribution without it:
the output still follows the target's distribution exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from ..request import Request

MAX_NGRAM = 4  # the longest suffix looked up (tokens)
MIN_NGRAM = 3  # the shortest: 1- and 2-token matches are too often wrong to pay a verification


def lookup(tokens: np.ndarray, k: int, max_ngram: int = MAX_NGRAM,
           min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
    suffix of ``tokens`` (``[L]`` int64, a request's prompt then output) of ``max_ngram``
    down to ``min_ngram`` tokens; ``[]`` when no such suffix occurs earlier or nothing
    follows it. Cost: one vectorized comparison of every window per n (O(L * n))."""
    n_tokens = tokens.shape[0]
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = tokens[n_tokens - n:]
        # windows starting at 0 .. L - n - 1: every occurrence but the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:n_tokens - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer:
    """Proposes drafts by prompt lookup (:func:`lookup`); the interface of
    ``DraftModelProposer`` that ``Speculator`` uses (``propose``, ``draft_probs``,
    ``last_catch_up``, ``rollback``, ``free``), without a model or a KV cache.

    Args:
        vocab_size: the target's vocabulary (the width of the one-hot draft distributions).
        device: where the draft distributions are built (the target's device).
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        # request id -> ``[k, vocab]`` fp32 one-hot rows of the latest drafts (sampled
        # requests only), read by the rejection step through the engine
        self.draft_probs: dict[str, torch.Tensor] = {}
        self.last_catch_up = 0  # no draft forward catches up on anything

    def propose(self, requests: list[Request], num_spec_tokens: dict[str, int],
                generators: dict[str, torch.Generator | None]) -> dict[str, list[int]]:
        """Request id -> up to ``num_spec_tokens[id]`` drafts, for requests whose tokens so
        far end in an n-gram that occurred before (others get none this step)."""
        self.draft_probs = {}
        proposed: dict[str, list[int]] = {}
        for req in requests:
            k = num_spec_tokens.get(req.request_id, 0)
            if k <= 0:
                continue
            tokens = np.fromiter((*req.prompt_token_ids, *req.output_token_ids),
                                 dtype=np.int64, count=req.num_tokens)
            drafts = lookup(tokens, k)
            if not drafts:
                continue
            proposed[req.request_id] = drafts
            if not req.sampling_params.greedy:
                probs = torch.zeros(len(drafts), self.vocab_size, dtype=torch.float32,
                                    device=self.device)
                probs[torch.arange(len(drafts)), torch.tensor(drafts)] = 1.0
                self.draft_probs[req.request_id] = probs
        return proposed

    def rollback(self, req: Request) -> None:
        """Nothing to rewind: the proposer keeps no state per request."""

    def free(self, request_id: str) -> None:
        """Nothing to free."""
