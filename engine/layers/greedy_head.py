"""Greedy tokens from a quantized CPU output layer in one integer-dot pass.

The integer-dot kernels round each activation row to int8 per 32-column block (``d = amax /
127`` per block, ``kernels.reference_a8``), so a logit moves by at most
``sum_b d_b / 2 * sum_{k in b} |w[n, k]|`` (``w`` the dequantized weight row ``n``). With
``G[b] = max_n sum_{k in b} |w[n, k]|`` (:func:`block_abs_sum_max`, computed once when the
weights are first repacked and cached with them) one bound ``B = sum_b d_b / 2 * G[b]``
holds for every token of the row, so the exact argmax lies among the tokens whose one-pass
logit is within ``2 B`` of the one-pass maximum. Those candidates (medians of 3-20 of a
49k-152k vocabulary on the bundle models, ``scripts/bench_greedy_head.py``) are rescored
exactly on their dequantized rows (the method's ``dequantize_rows``) and the best one is the
token: the argmax of the exact fp32 logits, as if the output layer had run through the exact
kernel, for about the price of one 1-row integer-dot call. What it replaces,
``kernels.a8_two_pass`` and an argmax, reads the same weights for 2 rows: on this project's
2-core AVX2 machine 1.9-2.3 ms against 2.7-3.0 (SmolLM2's Q8_0 head), 7.8-9.1 against
7.9-11.2 (Qwen2.5-0.5B, Q8_0), 6.7-8.8 against 7.9-12.1 (Qwen2.5-1.5B, Q6_K), min-median.
A row with more candidates than :func:`max_candidates` (a flat distribution) takes the
two-pass logits, whose error bound is about 254x smaller, and rescores their candidates.

Each row's token depends on that row alone (batch invariant), so a draft's verification picks
what plain decoding picks. Ties go to the lower token id, as ``argmax`` does. Reference
design: the error bound of llama.cpp's Q8_0 activation blocks, used as a filter before an
exact rescoring of the survivors (as exact top-k search over quantized vectors does).
"""

from __future__ import annotations

import torch
from torch import nn

from localchat import kernels
from localchat.kernels import reference_a8

BLOCK = reference_a8.A8_BLOCK
# a row with more candidates than max_candidates() takes the two-pass fallback
MAX_CANDIDATES = 64
CANDIDATE_SHARE = 128
BUFFER = "block_abs_sum_max"


def has_bound(layer: nn.Module) -> bool:
    """Whether ``layer`` carries :data:`BUFFER` (see :func:`add_bound_buffer`)."""
    return BUFFER in layer._buffers


def add_bound_buffer(layer: nn.Module, device: torch.device | str) -> None:
    """Register the persistent ``[K // 32]`` fp32 :data:`BUFFER` on ``layer`` (zeros until
    :func:`fill_bound`, or read from a weight cache with the rest of the state dict).
    Layers whose ``in_features`` is not a multiple of 32 get none."""
    k = layer.in_features
    if k % BLOCK:
        return
    layer.register_buffer(BUFFER, torch.zeros(k // BLOCK, dtype=torch.float32, device=device))


def bound_bytes(in_features: int) -> int:
    """Bytes of the :data:`BUFFER` :func:`add_bound_buffer` gives a layer of ``in_features``
    columns (4 per 32 columns; 0 where it gives none)."""
    return 0 if in_features % BLOCK else in_features // BLOCK * 4


def _weight_rows(layer: nn.Module, rows: slice | torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (a slice or ids ``[n]``) of ``layer``'s weight dequantized, ``[n, K]``
    fp32: the method's ``dequantize_rows`` (C++ where built) where it has one, else its
    ``embed``."""
    method = layer.quant_method
    if hasattr(method, "dequantize_rows"):
        return method.dequantize_rows(layer, rows)
    if isinstance(rows, slice):
        device = next(iter(layer.buffers())).device  # the ids where the weights are
        rows = torch.arange(layer.out_features, device=device)[rows]
    return method.embed(layer, rows, torch.float32)


def block_abs_sum_max(layer: nn.Module, chunk: int = 4096) -> torch.Tensor:
    """``G [K // 32]`` fp32: for each 32-column block of ``layer``'s weight ``[N, K]``, the
    largest ``sum |w[n, k]|`` over the block among the ``N`` rows, from the rows dequantized
    ``chunk`` at a time (0.1-0.5 s for a 152k x 1536 output layer on 2 threads; done once,
    when the weights are first repacked), on the device that holds the weights (on CUDA the
    rows dequantize there: a CPU ``G`` beside them failed every first load of a GGUF)."""
    n, k = layer.out_features, layer.in_features
    g = None
    for a in range(0, n, chunk):
        w = _weight_rows(layer, slice(a, min(a + chunk, n)))
        m = w.abs_().view(w.shape[0], -1, BLOCK).sum(-1).amax(0)
        g = m if g is None else torch.maximum(g, m)
    return g if g is not None else torch.zeros(k // BLOCK, dtype=torch.float32)


def fill_bound(layer: nn.Module) -> None:
    """Compute :data:`BUFFER` of ``layer`` from its (repacked) weights."""
    if BUFFER in layer._buffers:
        getattr(layer, BUFFER).copy_(block_abs_sum_max(layer))


def _error_bound(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``[n]``: the largest change of any logit when ``x [n, K]`` fp32 is rounded to int8
    blocks, ``sum_b d_b / 2 * G[b]``, plus room for the kernels' fp32 rounding."""
    d = x.abs().view(x.shape[0], -1, BLOCK).amax(-1) / 127.0
    return (d * g).sum(-1) * (0.5 * 1.001)


# logits per block of the two-level candidate search (_candidates)
_SEARCH_BLOCK = 256


def _candidates(logits_row: torch.Tensor, bound: float) -> torch.Tensor:
    """Ids ``[c]`` int64, ascending, of the entries of ``logits_row [V]`` within ``2 * bound``
    of its maximum, plus room for fp32 rounding (``1e-3 * (1 + |max|)``); empty when the row
    has a NaN maximum. Two levels: each 256-entry block's maximum, then only the blocks that
    reach the threshold (``torch.nonzero`` over a 152k row costs 0.25-0.5 ms here; this
    about 0.15)."""
    v = logits_row.shape[0]
    nb = v // _SEARCH_BLOCK
    body = logits_row[:nb * _SEARCH_BLOCK].view(nb, _SEARCH_BLOCK)
    tail = logits_row[nb * _SEARCH_BLOCK:]
    block_max = body.amax(-1)
    top = float(block_max.max()) if nb else float("-inf")
    if tail.shape[0]:
        top = max(top, float(tail.max()))
    threshold = top - (2.0 * bound + 1e-3 * (1.0 + abs(top)))
    hot = torch.nonzero(block_max >= threshold).view(-1)
    row, col = torch.nonzero(body[hot] >= threshold, as_tuple=True)
    ids = hot[row] * _SEARCH_BLOCK + col
    if tail.shape[0]:
        ids = torch.cat([ids, torch.nonzero(tail >= threshold).view(-1) + nb * _SEARCH_BLOCK])
    return ids


def _best(layer, x_row: torch.Tensor, ids: torch.Tensor) -> int:
    """The id among ``ids [c]`` (ascending) of the largest exact logit of ``x_row [K]``,
    rescored on the dequantized rows; ties go to the lower id."""
    if ids.shape[0] == 1:
        return int(ids[0])
    exact = (_weight_rows(layer, ids) * x_row).sum(-1)
    return int(ids[torch.max(exact, dim=0).indices])


def max_candidates(layer: nn.Module) -> int:
    """Candidates up to which a row is rescored rather than run through the two-pass
    fallback: :data:`MAX_CANDIDATES`, and at least 1/:data:`CANDIDATE_SHARE` of the
    vocabulary (rescoring that many rows, read one lane each by the panels' row gather, costs
    about 0.3x the second pass on SmolLM2's Q8_0 head and 2.5x on the 1.5B's Q6_K one)."""
    return max(MAX_CANDIDATES, layer.out_features // CANDIDATE_SHARE)


def greedy_token_ids(layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``[n]`` int64: for each row of ``hidden_states [n, K]`` fp32, the token of the largest
    exact logit (see the module doc). ``layer`` is a quantized output layer with a filled
    bound (:func:`has_bound`) whose CPU calls take the integer-dot kernels
    (``kernels.cpu_a8_enabled(torch.float32)``)."""
    x = hidden_states.float()
    g = getattr(layer, BUFFER)
    apply = layer.quant_method.apply
    cap = max_candidates(layer)
    out = []
    for i in range(0, x.shape[0], kernels.CPU_MAX_ROWS):
        xc = x[i:i + kernels.CPU_MAX_ROWS]
        logits = apply(layer, xc)
        bounds = _error_bound(xc, g).tolist()
        for r, bound in enumerate(bounds):
            ids = _candidates(logits[r], bound)
            if ids.shape[0] > cap:  # a flat distribution: the two passes' 254x finer bound
                xr = xc[r:r + 1]
                two = kernels.a8_two_pass(lambda z: apply(layer, z), xr)[0]
                ids = _candidates(two, float(_error_bound(xr - kernels.a8_rounded(xr), g)))
            # no candidate: NaN logits (a broken step); argmax's answer, a NaN's index
            out.append(_best(layer, xc[r], ids) if ids.shape[0]
                       else int(torch.max(logits[r], dim=0).indices))
    return torch.tensor(out, dtype=torch.int64)
