"""Sizing the KV pools on a GPU from what is left after the weights, planned all together.

On CUDA the engine loads the target's and the draft's weights first, then measures one
max-size forward of each (``measure_activation_bytes``: the activation peak the step loop
will need again), then splits the free memory (``torch.cuda.mem_get_info``) among: the
activation peak, the CUDA-graph pool (the same measurement at the largest captured decode
batch), a safety margin, and the target's and the draft's KV pools, which hold the same
number of tokens (the draft mirrors every sequence). Only then is anything allocated
(``plan_kv_pools``). Before this, the target's pool took 90% of free memory and the draft's
own pool then ran the GPU out of memory. Reference design: vLLM's
``determine_num_available_blocks`` (profile a dummy max-size batch, then size the pool).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import LocalchatError

MiB = 2**20
MARGIN_FRACTION = 0.05  # of free memory, for fragmentation and the allocator's slack
MARGIN_MIN = 256 * MiB


class KVPlanError(LocalchatError):
    """The memory left after the weights does not hold one KV block per pool."""


@dataclass(frozen=True)
class KVPoolPlan:
    """Bytes and blocks of one plan. ``num_blocks`` is each pool's size (target and draft
    alike); ``tokens = num_blocks * block_size``; ``kv_bytes``/``draft_kv_bytes`` the two
    pools; ``reserved_bytes`` = activations + graph pool + margin; all out of ``free_bytes``.
    """

    free_bytes: int
    activation_bytes: int
    graph_pool_bytes: int
    margin_bytes: int
    num_blocks: int
    block_size: int
    kv_bytes: int
    draft_kv_bytes: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def reserved_bytes(self) -> int:
        return self.activation_bytes + self.graph_pool_bytes + self.margin_bytes

    @property
    def total_bytes(self) -> int:
        return self.reserved_bytes + self.kv_bytes + self.draft_kv_bytes


def plan_kv_pools(free_bytes: int, *, bytes_per_token: int, draft_bytes_per_token: int = 0,
                  activation_bytes: int, graph_pool_bytes: int = 0, wanted_tokens: int,
                  block_size: int, min_tokens: int = 1) -> KVPoolPlan:
    """Blocks for the target's and the draft's KV pools out of ``free_bytes`` (bytes free on
    the device with every weight loaded and nothing else allocated).

    ``bytes_per_token``/``draft_bytes_per_token``: KV bytes per token of each model (0: no
    draft); ``activation_bytes``: the measured peak of one max-size step; ``graph_pool_bytes``:
    what the CUDA graphs keep; ``wanted_tokens``: ``max_model_len x max_num_seqs`` (the pool
    never exceeds it); ``min_tokens``: the smallest pool that is usable (``max_model_len``
    when the user fixed it). Both pools get ``num_blocks`` blocks of ``block_size`` tokens.
    Raises ``KVPlanError`` (with the numbers) when fewer than ``min_tokens`` fit.
    """
    margin = max(MARGIN_MIN, int(free_bytes * MARGIN_FRACTION))
    per_token = bytes_per_token + draft_bytes_per_token
    left = free_bytes - activation_bytes - graph_pool_bytes - margin
    # Whole blocks: a wanted 100 tokens take 7 blocks of 16, not 6 (96 slots).
    wanted_tokens = -(-wanted_tokens // block_size) * block_size
    tokens = min(wanted_tokens, max(left, 0) // per_token)
    num_blocks = tokens // block_size
    if num_blocks < 1 or num_blocks * block_size < min(min_tokens, wanted_tokens):
        raise KVPlanError(
            f"not enough GPU memory for the KV cache: {free_bytes / MiB:.0f} MiB free after "
            f"the weights, {activation_bytes / MiB:.0f} MiB activations, "
            f"{graph_pool_bytes / MiB:.0f} MiB CUDA graphs, {margin / MiB:.0f} MiB margin "
            f"leave {max(left, 0) / MiB:.0f} MiB; {min_tokens} tokens need "
            f"{min_tokens * per_token / MiB:.0f} MiB (use a smaller model, --quant, or a "
            "shorter context)")
    return KVPoolPlan(free_bytes, activation_bytes, graph_pool_bytes, margin, num_blocks,
                      block_size, num_blocks * block_size * bytes_per_token,
                      num_blocks * block_size * draft_bytes_per_token)


@torch.inference_mode()
def measure_activation_bytes(model, model_config, *, num_tokens: int, logit_rows: int,
                             block_size: int, dtype: torch.dtype, device: torch.device,
                             decode_batch: int = 0) -> tuple[int, int]:
    """``(step_peak, decode_peak)`` bytes on CUDA: the allocator's peak above the weights
    during one prefill forward of ``num_tokens`` tokens plus logits for ``logit_rows`` rows,
    and during one decode forward of ``decode_batch`` sequences (the CUDA graphs' pool; 0 when
    ``decode_batch`` is 0). Uses a throw-away KV cache just large enough (its bytes are not
    counted) and frees everything before returning."""
    from ..attention_metadata import AttentionMetadata, seq_len_bucket
    from ..kv_cache import allocate_kv_caches

    c = model_config
    blocks = -(-num_tokens // block_size) + 1
    kv = allocate_kv_caches(c.num_hidden_layers, blocks, block_size, c.num_kv_heads,
                            c.head_dim, dtype, device)

    def meta(n_seqs: int, n_tokens: int) -> AttentionMetadata:
        per = n_tokens // n_seqs
        i64 = {"dtype": torch.int64, "device": device}
        return AttentionMetadata(
            slot_mapping=torch.arange(n_tokens, **i64) % (blocks * block_size),
            block_tables=torch.arange(blocks, **i64).repeat(n_seqs, 1),
            seq_lens=torch.full((n_seqs,), per, **i64),
            query_start_loc=torch.arange(n_seqs + 1, **i64) * per,
            max_query_len=per, max_seq_len=seq_len_bucket(per))

    def peak(n_seqs: int, n_tokens: int, rows: int) -> int:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        ids = torch.zeros(n_tokens, dtype=torch.int64, device=device)
        pos = torch.arange(n_tokens, device=device) % (n_tokens // n_seqs)
        hidden = model(ids, pos, kv, meta(n_seqs, n_tokens))
        logits = model.compute_logits(hidden[:rows]).float()
        del hidden, logits
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base

    try:
        step = peak(1, num_tokens, min(logit_rows, num_tokens))
        decode = peak(decode_batch, decode_batch, decode_batch) if decode_batch else 0
    finally:
        kv.clear()  # drop the throw-away cache before emptying the allocator
        torch.cuda.empty_cache()
    return step, decode


def plan_cuda_pools(model, model_config, draft_model, draft_config,
                    config, max_model_len: int):
    """``(config, KVPoolPlan)``: ``config`` (an ``EngineConfig``) with ``cache.num_blocks``
    from :func:`plan_kv_pools`: the free GPU
    memory after the target's and the draft's weights, less the measured activation peak of
    one max-size step (the larger of the two models), the CUDA-graph pool (a measured decode
    step at the largest captured batch), and a margin, split between the two KV pools (the
    same tokens each). Raises ``KVPlanError`` when not even one block fits."""
    import dataclasses
    import os

    from ..cuda_graphs import DEFAULT_BATCH_SIZES, graph_unsafe_reason
    from .footprint import kv_bytes

    device, dtype = config.resolved_device(), config.resolved_dtype()
    sched, block_size = config.scheduler, config.cache.block_size
    k = config.speculative.num_speculative_tokens if draft_model is not None else 0
    rows = sched.max_num_seqs * (1 + k)
    graphs = (os.environ.get("LOCALCHAT_CUDA_GRAPHS") != "0"
              and graph_unsafe_reason(model) is None)
    tokens = min(sched.max_num_batched_tokens, max_model_len)
    common = {"num_tokens": tokens, "logit_rows": rows, "block_size": block_size,
              "dtype": dtype, "device": device}
    act, graph_pool = measure_activation_bytes(
        model, model_config, decode_batch=max(DEFAULT_BATCH_SIZES) if graphs else 0, **common)
    draft_bpt = 0
    if draft_model is not None:
        act = max(act, measure_activation_bytes(draft_model, draft_config, **common)[0])
        draft_bpt = kv_bytes(draft_config, 1, dtype)
    act += rows * model_config.vocab_size * 4 * 3  # the sampler's fp32 copies of the logits
    plan = plan_kv_pools(
        int(torch.cuda.mem_get_info(device)[0]),
        bytes_per_token=kv_bytes(model_config, 1, dtype),
        draft_bytes_per_token=draft_bpt, activation_bytes=act, graph_pool_bytes=graph_pool,
        wanted_tokens=max_model_len * sched.max_num_seqs, block_size=block_size,
        min_tokens=max_model_len if sched.max_model_len is not None else block_size)
    logging.getLogger(__name__).info("KV plan: %d blocks per pool (%.0f MiB target, %.0f MiB draft) after "
                "%.0f MiB activations, %.0f MiB CUDA graphs, %.0f MiB margin",
                plan.num_blocks, plan.kv_bytes / 2**20, plan.draft_kv_bytes / 2**20,
                act / 2**20, graph_pool / 2**20, plan.margin_bytes / 2**20)
    cache = dataclasses.replace(config.cache, num_blocks=plan.num_blocks)
    return dataclasses.replace(config, cache=cache), plan
