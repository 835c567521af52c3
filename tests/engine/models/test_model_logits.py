"""Our model code + paged KV cache vs transformers' modeling code on the same weights.

fp32, max abs diff <= 1e-4, prompts of 1, 15, 16, 17 and 100 tokens with block_size 16, over a
deliberately scrambled block table so that paging bugs cannot hide behind contiguous blocks.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.attention_metadata import AttentionMetadata
from localchat.engine.kv_cache import allocate_kv_caches
from localchat.engine.loader import load_model, load_model_config

from ..tiny_models import ARCHS, save_tiny_model

BLOCK_SIZE = 16
NUM_BLOCKS = 32
TOL = 1e-4


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_model(request.param, folder)
    config = load_model_config(folder)
    ours = load_model(folder, config, dtype=torch.float32, device=torch.device("cpu"),
                      max_position=512)
    return request.param, hf_model, ours, config


class PagedSequence:
    """One sequence driven through the model by hand: its block table and cache."""

    def __init__(self, model, config, block_ids):
        self.model = model
        self.kv_caches = allocate_kv_caches(
            config.num_hidden_layers, NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads,
            config.head_dim, torch.float32, torch.device("cpu"),
        )
        for cache in self.kv_caches:  # garbage in unused slots must never be read
            cache.fill_(float("nan"))
        self.block_ids = block_ids
        self.num_computed = 0

    @torch.inference_mode()
    def forward(self, token_ids: list[int]) -> torch.Tensor:
        """Feed the next tokens; return their logits ``[len(token_ids), vocab]``."""
        start, n = self.num_computed, len(token_ids)
        pos = list(range(start, start + n))
        slots = [self.block_ids[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            block_tables=torch.tensor([self.block_ids]),
            seq_lens=torch.tensor([start + n]),
            query_start_loc=torch.tensor([0, n]),
            max_query_len=n,
        )
        hidden = self.model(torch.tensor(token_ids), torch.tensor(pos), self.kv_caches, meta)
        self.num_computed += n
        return self.model.compute_logits(hidden)


def _oracle_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def _scrambled_blocks(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(NUM_BLOCKS, generator=g)[:n].tolist()


@pytest.mark.parametrize("length", [1, 15, 16, 17, 100])
def test_prefill_logits_match_transformers(tiny, length):
    arch, hf_model, ours, config = tiny
    ids = torch.randint(0, config.vocab_size, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    seq = PagedSequence(ours, config, _scrambled_blocks(8, length))
    got = seq.forward(ids)
    want = _oracle_logits(hf_model, ids)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL, arch


@pytest.mark.parametrize("length", [15, 16, 17, 100])
def test_chunked_prefill_then_decode_match_transformers(tiny, length):
    """Prefill in chunks of 7 over the cached prefix, then decode 5 tokens one at a time."""
    arch, hf_model, ours, config = tiny
    gen = torch.Generator().manual_seed(1000 + length)
    ids = torch.randint(0, config.vocab_size, (length + 5,), generator=gen).tolist()
    want = _oracle_logits(hf_model, ids)
    seq = PagedSequence(ours, config, _scrambled_blocks(8, 7 * length))
    rows = []
    for s in range(0, length, 7):
        rows.append(seq.forward(ids[s : min(s + 7, length)]))
    for t in ids[length:]:
        rows.append(seq.forward([t]))
    got = torch.cat(rows)
    assert (got - want).abs().max().item() <= TOL, arch


def test_batched_decode_matches_single(tiny):
    """Two sequences of different lengths decoded in one batch equal each decoded alone."""
    from localchat.kernels import paged_attention_decode, prefill_attention

    _, hf_model, ours, config = tiny
    a = list(range(3, 3 + 20))
    b = list(range(50, 50 + 33))
    want_a = _oracle_logits(hf_model, a)[-1]
    want_b = _oracle_logits(hf_model, b)[-1]
    blocks_a, blocks_b = [5, 1, 9], [2, 7, 30]
    kv = allocate_kv_caches(config.num_hidden_layers, NUM_BLOCKS, BLOCK_SIZE,
                            config.num_kv_heads, config.head_dim, torch.float32,
                            torch.device("cpu"))
    with torch.inference_mode():
        for ids, blocks in ((a[:-1], blocks_a), (b[:-1], blocks_b)):
            seq = PagedSequence(ours, config, blocks)
            seq.kv_caches = kv
            seq.forward(ids)
        pos = [len(a) - 1, len(b) - 1]
        slots = [blocks_a[pos[0] // 16] * 16 + pos[0] % 16, blocks_b[pos[1] // 16] * 16 + pos[1] % 16]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            block_tables=torch.tensor([blocks_a, blocks_b]),
            seq_lens=torch.tensor([len(a), len(b)]),
            query_start_loc=torch.tensor([0, 1, 2]),
            max_query_len=1,
        )
        hidden = ours(torch.tensor([a[-1], b[-1]]), torch.tensor(pos), kv, meta)
        got = ours.compute_logits(hidden)
    assert paged_attention_decode is not None and prefill_attention is not None
    assert (got[0] - want_a).abs().max().item() <= TOL
    assert (got[1] - want_b).abs().max().item() <= TOL
