"""Greedy tokens from a quantized CPU output layer in one integer-dot pass.

The integer-dot kernels round each activation row to int8 per 32-column block (``d = amax /
127`` per block, ``kernels.reference_a8``), so a logit moves by at most
``sum_b d_b / 2 * sum_{k in b} |w[n, k]|`` (``w`` the dequantized weight row ``n``). With
``G[b] = max_n sum_{k in b} |w[n, k]|`` (:func:`block_abs_sum_max`, computed once at load and
cached with the weights) one bound ``B = sum_b d_b / 2 * G[b]`` holds for every token of the
row, so the exact argmax lies among the tokens whose one-pass logit is within ``2 B`` of the
one-pass maximum. Those candidates (a median of 1-10 of a 49k-152k vocabulary on the bundle
models, ``scripts/bench_greedy_head.py``) are rescored exactly on their dequantized rows
(``quant_method.embed``) and the best one is the token: the argmax of the exact fp32 logits,
as if the output layer had run through the exact kernel, for the price of one 1-row
integer-dot call (the two-pass call it replaces, ``kernels.a8_two_pass``, reads the same
weights for 2 rows: 10.7-11.3 ms against 7.5 ms on Qwen2.5-1.5B's Q6_K head here). A row with
more than :data:`MAX_CANDIDATES` candidates (a flat distribution) takes the two-pass logits,
whose error bound is about 254x smaller, and rescores their candidates the same way.

Each row's token depends on that row alone (batch invariant), so a draft's verification picks
what plain decoding picks. Ties go to the lower token id, as ``argmax`` does. Reference
design: the error bound of llama.cpp's Q8_0 activation blocks, applied as a filter the way
top-k candidate rescoring is done in speculative and retrieval systems.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat import kernels
from localchat.kernels import reference_a8

BLOCK = reference_a8.A8_BLOCK
# rescoring more rows than this per token costs about what the second integer-dot pass costs
MAX_CANDIDATES = 64
BUFFER = "block_abs_sum_max"


def has_bound(layer: nn.Module) -> bool:
    """Whether ``layer`` carries a filled :data:`BUFFER` (see :func:`add_bound_buffer`)."""
    b = layer._buffers.get(BUFFER)
    return b is not None and not b.is_meta


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


def block_abs_sum_max(layer: nn.Module, chunk: int = 4096) -> torch.Tensor:
    """``G [K // 32]`` fp32: for each 32-column block of ``layer``'s weight ``[N, K]``, the
    largest ``sum |w[n, k]|`` over the block among the ``N`` rows, from the rows dequantized
    ``chunk`` at a time (the method's ``dequantize_rows`` where it has one, else ``embed``;
    done once, when the weights are first repacked)."""
    n, k = layer.out_features, layer.in_features
    method = layer.quant_method
    rows = getattr(method, "dequantize_rows", None)  # the layout's fast path, where it has one
    g = torch.zeros(k // BLOCK, dtype=torch.float32)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        w = rows(layer, a, b) if rows is not None else \
            method.embed(layer, torch.arange(a, b), torch.float32)
        torch.maximum(g, w.abs_().view(b - a, -1, BLOCK).sum(-1).amax(0), out=g)
    return g


def fill_bound(layer: nn.Module) -> None:
    """Compute :data:`BUFFER` of ``layer`` from its (repacked) weights."""
    if BUFFER in layer._buffers:
        getattr(layer, BUFFER).copy_(block_abs_sum_max(layer))


def _error_bound(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``[n]``: the largest change of any logit when ``x [n, K]`` fp32 is rounded to int8
    blocks, ``sum_b d_b / 2 * G[b]``, plus room for the kernels' fp32 rounding."""
    d = x.abs().view(x.shape[0], -1, BLOCK).amax(-1) / 127.0
    return (d * g).sum(-1) * (0.5 * 1.001)


def _rescored(layer, x_row: torch.Tensor, logits_row: torch.Tensor,
              bound: float) -> tuple[int, int]:
    """``(token, candidates)``: the exact argmax among the tokens of ``logits_row [V]`` whose
    value is within ``2 * bound`` of its maximum, rescored on their dequantized rows."""
    top = float(logits_row.max())
    slack = 2.0 * bound + 1e-3 * (1.0 + abs(top))
    ids = torch.nonzero(logits_row >= top - slack).view(-1)  # ascending: ties -> lower id
    if len(ids) == 1:
        return int(ids[0]), 1
    rows = layer.quant_method.embed(layer, ids, torch.float32)
    exact = (rows * x_row).sum(-1)
    return int(ids[torch.max(exact, dim=0).indices]), len(ids)


def greedy_token_ids(layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``[n]`` int64: for each row of ``hidden_states [n, K]`` fp32, the token of the largest
    exact logit (see the module doc). ``layer`` is a quantized output layer with a filled
    bound (:func:`has_bound`) whose CPU calls take the integer-dot kernels
    (``kernels.cpu_a8_enabled(torch.float32)``)."""
    x = hidden_states.float()
    g = getattr(layer, BUFFER)
    apply = layer.quant_method.apply
    out = []
    for i in range(0, x.shape[0], kernels.CPU_MAX_ROWS):
        xc = x[i:i + kernels.CPU_MAX_ROWS]
        logits = apply(layer, xc)
        bounds = _error_bound(xc, g).tolist()
        for r, bound in enumerate(bounds):
            token, count = _rescored(layer, xc[r], logits[r], bound)
            if count > MAX_CANDIDATES:
                xr = xc[r:r + 1]
                two = kernels.a8_two_pass(lambda z: apply(layer, z), xr)[0]
                q, d = reference_a8.quantize_activations_int8(xr)
                hi = (q.float().view(1, -1, BLOCK) * d[..., None]).view_as(xr)
                token, _ = _rescored(layer, xc[r], two, float(_error_bound(xr - hi, g)))
            out.append(token)
    return torch.tensor(out, dtype=torch.int64)
