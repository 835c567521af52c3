"""Logits -> token ids (and optional logprobs) for the whole batch in one call.

Order of operations per row (all rows at once, ``[num_seqs, vocab]`` fp32 tensors):

1. Penalties, only when some row uses one (a batch of defaults builds no count tensors):
   - ``repetition_penalty`` over prompt + output tokens, transformers semantics
     (``RepetitionPenaltyLogitsProcessor``; Keskar et al. 2019, CTRL): a seen token's logit is
     divided by the penalty when positive and multiplied by it when negative.
   - then ``presence_penalty`` / ``frequency_penalty`` over output tokens only, OpenAI
     semantics (platform.openai.com/docs, "Parameter details"):
     ``logit -= presence * (count > 0) + frequency * count``.
   The order (repetition first, then presence/frequency) is vLLM's ``apply_penalties``.
2. Logprobs (rows with ``logprobs is not None``): ``log_softmax`` of the penalized logits,
   before temperature, top-k, top-p and min-p. This is the distribution of the model after
   penalties, independent of the decoding knobs; with no penalty it equals vLLM's default
   ``raw_logprobs``. Each row gets ``{token_id: logprob}`` of its top-n tokens plus the
   sampled token (n or n + 1 entries).
3. Greedy rows (temperature 0 or top_k 1) take the exact argmax of the penalized logits
   (penalties apply to greedy decoding too, as in transformers).
4. Sampled rows: temperature (after subtracting the row max, so tiny temperatures stay
   finite), then top-k, then top-p (nucleus, Holtzman et al. 2019) on the distribution left by
   top-k, then min-p (Nguyen et al. 2024, arXiv 2407.01082: drop tokens with probability below
   ``min_p`` times the top token's; the top token is always kept), then the draw from the
   softmax: seeded requests with their own ``torch.Generator`` (so a seed reproduces whatever
   else is in the batch), the rest from the global RNG, both by the exponential-race trick
   (argmax of ``probs / Exponential(1)``), which equals a categorical draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    """Per-row sampling settings for a batch of ``num_seqs`` logit rows.

    ``generators`` holds one ``torch.Generator`` (or ``None``) per row.
    ``prompt_token_ids`` / ``output_token_ids``: one list of token ids per row, or ``None``
    when no row needs them. Only rows with a penalty read them (the prompt only for
    ``repetition_penalty``); other rows may pass empty lists.
    """

    params: list[SamplingParams]
    generators: list[torch.Generator | None]
    prompt_token_ids: list[list[int]] | None = None
    output_token_ids: list[list[int]] | None = None

    @property
    def all_greedy(self) -> bool:
        return all(p.greedy for p in self.params)

    @property
    def any_repetition_penalty(self) -> bool:
        return any(p.uses_repetition_penalty for p in self.params)

    @property
    def any_output_penalty(self) -> bool:
        return any(p.uses_output_penalty for p in self.params)

    @property
    def any_logprobs(self) -> bool:
        return any(p.logprobs is not None for p in self.params)


@dataclass
class SamplerOutput:
    """``token_ids [num_seqs]`` int64; ``logprobs``: per row ``{token_id: logprob}`` (top-n
    plus the sampled token) or ``None`` when that row did not ask for logprobs."""

    token_ids: torch.Tensor
    logprobs: list[dict[int, float] | None] = field(default_factory=list)


def token_counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Occurrences of each token id per row: ``[len(rows), vocab]`` int64, one bincount.

    ``rows``: one list of token ids per logits row (may be empty); ids outside
    ``[0, vocab)`` are ignored.
    """
    n = len(rows)
    flat = [t for r in rows for t in r]
    if not flat:
        return torch.zeros(n, vocab, dtype=torch.int64, device=device)
    lengths = row_values([len(r) for r in rows], torch.int64, device)
    ids = row_values(flat, torch.int64, device)
    # output_size given: repeat_interleave would otherwise read the lengths' sum back
    row_idx = torch.repeat_interleave(torch.arange(n, device=device), lengths,
                                      output_size=len(flat))
    flat_idx = row_idx * vocab + ids
    # An id outside the logits' vocab (a tokenizer-only added token) has no logit to penalize;
    # without this filter it would land in the next row.
    flat_idx = flat_idx[(ids >= 0) & (ids < vocab)]
    return torch.bincount(flat_idx, minlength=n * vocab).view(n, vocab)


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Repetition, then presence/frequency penalties, row-wise; returns a new tensor.

    ``logits [num_seqs, vocab]`` fp32. Rows whose penalties are neutral (1, 0, 0) come back
    bit-identical. A positive logit divided by a penalty < 1 is clamped to the fp32 max so it
    cannot become ``inf`` (and then ``NaN`` after the max shift).
    """
    vocab = logits.shape[-1]
    device = logits.device
    params = metadata.params
    out = logits
    if metadata.any_repetition_penalty:
        prompt = metadata.prompt_token_ids or [[] for _ in params]
        output = metadata.output_token_ids or [[] for _ in params]
        rows = [list(p) + list(o) if sp.uses_repetition_penalty else []
                for sp, p, o in zip(params, prompt, output)]
        seen = token_counts(rows, vocab, device) > 0
        penalty = row_values([p.repetition_penalty for p in params], logits.dtype,
                              device)[:, None].expand_as(logits)
        penalized = torch.where(out > 0, out / penalty, out * penalty)
        out = torch.where(seen, penalized, out).clamp(max=torch.finfo(logits.dtype).max)
    if metadata.any_output_penalty:
        output = metadata.output_token_ids or [[] for _ in params]
        rows = [list(o) if sp.uses_output_penalty else []
                for sp, o in zip(params, output)]
        counts = token_counts(rows, vocab, device)
        presence = row_values([p.presence_penalty for p in params], logits.dtype,
                               device)[:, None]
        frequency = row_values([p.frequency_penalty for p in params], logits.dtype,
                                device)[:, None]
        out = out - (presence * (counts > 0).to(logits.dtype)
                     + frequency * counts.to(logits.dtype))
    return out



def apply_penalties_after_drafts(logits: torch.Tensor, params: SamplingParams,
                                 prompt_token_ids: list[int], output_token_ids: list[int],
                                 draft_token_ids: list[int]) -> torch.Tensor:
    """Penalties for one request's rows at the positions after its draft tokens, with the
    drafts before each position counted as output (speculative decoding: the draft shapes its
    distributions and the target verifies with the same penalties plain decoding would
    apply once those tokens were emitted).

    ``logits [n, vocab]`` fp32: row ``i`` is the position after the first
    ``len(draft_token_ids) - n + 1 + i`` drafts, so the last row follows every draft (the
    verifier passes ``k + 1`` rows for ``k`` drafts; the proposer one row after the drafts so
    far). Returns ``logits`` itself when ``params`` has no penalty, else a new tensor
    (:func:`apply_penalties`).
    """
    if not (params.uses_repetition_penalty or params.uses_output_penalty):
        return logits
    n = logits.shape[0]
    first = len(draft_token_ids) - n + 1
    if first < 0:
        raise ValueError(f"{n} rows need at least {n - 1} draft tokens, got "
                         f"{len(draft_token_ids)}")
    outputs = [list(output_token_ids) + draft_token_ids[:first + i] for i in range(n)]
    meta = SamplingMetadata(params=[params] * n, generators=[None] * n,
                            prompt_token_ids=[prompt_token_ids] * n, output_token_ids=outputs)
    return apply_penalties(logits, meta)


# Candidate counts the CPU filter tries before a full sort of the vocabulary (``topk`` of 64 /
# 1024 out of 49k-152k logits costs 0.15-1.3 ms on this project's CPU, the sort 4-16 ms).
_CANDIDATE_LADDER = (64, 1024, 8192)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                        max_top_k: int | None = None):
    """Mask (``-inf``) everything outside top-k and the top-p nucleus, row-wise.

    ``logits [n, vocab]`` fp32, ``top_k [n]`` int64 (0 = off), ``top_p [n]`` fp32 (1 = off).
    Top-p acts on the distribution left by top-k, renormalized (transformers' / vLLM's order);
    the most likely token is always kept. ``max_top_k``: the largest ``top_k`` (known on the
    host); given, on CPU, the filter first works on the ``topk`` candidates alone (the same
    kept sets as sorting the whole row, ties aside, which either order may break) and sorts
    the whole vocabulary only when a row's nucleus reaches past them. On CUDA the sort is
    cheap and needs no host round trip, so it always runs.
    """
    vocab = logits.shape[-1]
    if max_top_k is not None and logits.is_cpu:
        for c in _CANDIDATE_LADDER:
            c = max(c, max_top_k)
            if c >= vocab:
                break
            out = _filter_candidates(logits, top_k, top_p, c)
            if out is not None:
                return out
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    remove = ranks >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    # (the 87 floor as in _filter_candidates: masked entries gain at most 2**-125 each)
    probs = torch.maximum(sorted_logits, sorted_logits[:, :1] - 87.0).softmax(dim=-1)
    probs = probs.masked_fill(remove, 0.0)
    cum_before = probs.cumsum(dim=-1) - probs  # mass strictly above this token
    # Rows with top_p == 1 are untouched: an fp32 cumsum can overshoot 1 on a large vocab.
    remove |= (cum_before > top_p[:, None]) & (top_p < 1)[:, None]
    remove[:, 0] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def _filter_candidates(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       c: int) -> torch.Tensor | None:
    """:func:`_filter_top_k_top_p` over each row's ``c`` largest logits (``c`` >= every
    ``top_k``), or ``None`` when some row's nucleus may reach past them (a top-p-only row
    whose candidates hold no more than ``top_p`` of the mass). Rows with both filters off are
    returned as they are."""
    vals, idx = logits.topk(c, dim=-1)  # sorted, descending
    ranks = torch.arange(c, device=logits.device)
    has_k = top_k > 0
    remove = ranks >= torch.where(has_k, top_k, torch.full_like(top_k, c))[:, None]
    vals = vals.masked_fill(remove, float("-inf"))
    # the distribution top-p sees: over the top-k set, or (no top-k) the whole vocabulary,
    # whose logits more than 87 below the row's max are raised to that floor first: their
    # exp (< 2**-125 of the max's) moves no fp32 sum of at least 1, and exp below the floor
    # takes a slow path (50x the time over a 49k row here)
    lse = vals.logsumexp(dim=-1)
    if not bool(has_k.all()):  # a CPU read (this path runs on CPU logits only)
        full = torch.maximum(logits, vals[:, :1] - 87.0).logsumexp(dim=-1)
        lse = torch.where(has_k, lse, full)
    probs = (vals - lse[:, None]).exp()
    cum = probs.cumsum(dim=-1)
    p_on = top_p < 1
    off = ~has_k & ~p_on
    # a top-p-only row is covered when the mass above rank c already exceeds top_p: rank c
    # and everything below it are cut, as a full sort would cut them
    if bool(((~has_k & p_on) & (cum[:, -1] <= top_p)).any()):
        return None
    remove |= ((cum - probs) > top_p[:, None]) & p_on[:, None]
    remove[:, 0] = False
    out = torch.full_like(logits, float("-inf")).scatter_(
        -1, idx, vals.masked_fill(remove, float("-inf")))
    if bool(off.any()):
        out[off] = logits[off]
    return out


def _filter_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask (``-inf``) tokens with ``prob < min_p * max prob``, row-wise (transformers'
    ``MinPLogitsWarper``; Nguyen et al. 2024, arXiv 2407.01082).

    ``logits [n, vocab]`` fp32 (already temperature-scaled and filtered), ``min_p [n]`` fp32
    (0 = off). The ratio to the top probability does not depend on renormalization, so the mask
    is the same before or after top-k / top-p. The top token is always kept.
    """
    probs = logits.softmax(dim=-1)
    top = probs.max(dim=-1, keepdim=True)
    remove = probs < min_p[:, None] * top.values
    remove.scatter_(-1, top.indices, False)
    return logits.masked_fill(remove, float("-inf"))


def _gather_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor,
                     params: list[SamplingParams]) -> list[dict[int, float] | None]:
    """``logprobs [n, vocab]`` fp32, ``tokens [n]`` int64 -> per row ``{id: logprob}`` of the
    top-``params[i].logprobs`` ids plus the sampled one (``None`` for rows not asking)."""
    max_n = max(p.logprobs or 0 for p in params)
    top_vals, top_ids = logprobs.topk(max_n, dim=-1) if max_n else (None, None)
    sampled_vals = logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
    top_vals = top_vals.tolist() if max_n else None
    top_ids = top_ids.tolist() if max_n else None
    token_list = tokens.tolist()
    out: list[dict[int, float] | None] = []
    for i, p in enumerate(params):
        if p.logprobs is None:
            out.append(None)
            continue
        row = {}
        if p.logprobs:
            row = dict(zip(top_ids[i][:p.logprobs], top_vals[i][:p.logprobs]))
        row[token_list[i]] = sampled_vals[i]
        out.append(row)
    return out


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x [n, vocab]`` -> ``[n]`` int64: the index of each row's maximum, the first one on
    ties (a NaN counts as the maximum), exactly ``x.argmax(dim=-1)``. Computed by
    ``torch.max(x, dim=-1)``, whose CPU reduction is vectorized: 2-3x faster than
    ``argmax`` over a 49k-152k vocabulary row here (64 vs 192 us at 151,936 fp32 logits, 2
    threads), which every greedy decode step pays."""
    return torch.max(x, dim=-1).indices


def exponential_race(probs: torch.Tensor,
                     generators: list[torch.Generator | None] | torch.Generator | None = None
                     ) -> torch.Tensor:
    """One categorical draw per row of ``probs [n, vocab]`` (fp32, rows summing to 1) by the
    exponential race: ``argmax(p / E)`` with ``E ~ Exponential(1)`` i.i.d. picks index ``i``
    with probability ``p_i`` (the Gumbel-max trick in another form; vLLM's sampler draws the
    same way). Returns ``[n]`` int64 ids.

    ``generators``: one per row (``None`` entries use the global RNG), or one generator (or
    ``None``) drawing the whole ``[n, vocab]`` noise tensor at once. Every sampling draw of
    the engine (sampler, rejection sampler, draft proposer) goes through here.
    """
    noise = torch.empty_like(probs)
    if isinstance(generators, list):
        for i, gen in enumerate(generators):
            _exponential_(noise[i], gen)
    else:
        _exponential_(noise, generators)
    return row_argmax(probs / noise)


def _exponential_(noise: torch.Tensor, generator: torch.Generator | None) -> None:
    """Fill ``noise`` (fp32) in place with Exponential(1) draws by inversion, ``-log(U)`` for
    ``U`` uniform on ``[2**-126, 1)``: finite and > 0, so ``p / E`` is never NaN or a
    division by zero. (``Tensor.exponential_`` costs 4-5x these three passes on CPU: 1.2 ms
    against 0.27 ms over a 49k vocabulary here; the 2**-126 floor moves a mass of 2**-126.)"""
    noise.uniform_(generator=generator).clamp_min_(_TINY).log_().neg_()


_TINY = torch.finfo(torch.float32).tiny


def row_values(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (one per row) as a ``[n]`` ``dtype`` tensor on ``device`` without a sync:
    built on the host (pinned when ``device`` is CUDA, from PyTorch's caching host
    allocator, which keeps the block until the copy is done) and sent with
    ``non_blocking=True``. ``torch.tensor(values, device=cuda)`` would be a pageable copy and
    a stream sync per call."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: ``logits [n, vocab]`` fp32 (already
    penalized) -> ``probs [n, vocab]`` fp32 after temperature, top-k, top-p and min-p (steps
    4 of the module docstring; greedy rows get temperature 1, their probs unused here).
    The speculative decoder's draft and target distributions come from here too, so they
    match what plain sampling would draw from."""
    device = logits.device
    temps = row_values([p.temperature if not p.greedy else 1.0 for p in params],
                        torch.float32, device)
    # Subtract the row max before dividing: the top logit becomes exactly 0 and the rest
    # go to (at worst) -inf, so any temperature > 0, however tiny, stays NaN-free and a
    # tiny one concentrates all mass on the argmax (no clamp that would flatten gaps).
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    tiny = torch.finfo(torch.float32).tiny
    scaled = shifted / temps.clamp_min(tiny)[:, None]
    if any(p.top_k > 0 or p.top_p < 1 for p in params):  # decided on the host: no sync
        top_k = row_values([p.top_k for p in params], torch.int64, device)
        top_p = row_values([p.top_p for p in params], torch.float32, device)
        scaled = _filter_top_k_top_p(scaled, top_k, top_p, max(p.top_k for p in params))
    if any(p.min_p > 0.0 and not p.greedy for p in params):
        min_p = row_values([0.0 if p.greedy else p.min_p for p in params], torch.float32,
                            device)
        scaled = _filter_min_p(scaled, min_p)
    return scaled.softmax(dim=-1)


class Sampler:
    """``sample(logits [num_seqs, vocab] fp32, metadata) -> [num_seqs] int64 token ids``;
    ``forward`` also returns the logprobs rows asked for (``SamplerOutput``)."""

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        return self.forward(logits, metadata).token_ids

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        params = metadata.params
        if metadata.any_repetition_penalty or metadata.any_output_penalty:
            logits = apply_penalties(logits, metadata)
        tokens = self._draw(logits, metadata)
        logprobs: list[dict[int, float] | None] = [None] * len(params)
        if metadata.any_logprobs:
            logprobs = _gather_logprobs(logits.log_softmax(dim=-1), tokens, params)
        return SamplerOutput(tokens, logprobs)

    def _draw(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """``logits [n, vocab]`` fp32 (penalized) -> ``[n]`` int64 token ids."""
        if metadata.all_greedy:
            return row_argmax(logits)
        if not any(p.greedy for p in metadata.params):
            greedy_tokens = None
        else:
            greedy_tokens = row_argmax(logits)
        device = logits.device
        params = metadata.params
        gens = metadata.generators
        # No seeded row: one draw of the global RNG fills the whole noise tensor.
        sampled = exponential_race(sampling_probs(logits, params),
                                   list(gens) if any(g is not None for g in gens) else None)
        if not any(p.greedy for p in params):
            return sampled
        is_greedy = row_values([p.greedy for p in params], torch.bool, device)
        return torch.where(is_greedy, greedy_tokens, sampled)
