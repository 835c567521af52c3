"""Persistent CPU step inputs (``StagingBuffers(persistent=True)``) against fresh buffers.

The model runner's staging ring keeps its step tensors as views of the ring slots and reuses
them while a slot's batch layout repeats; every step must still see exactly the tensors a
fresh, non-persistent ``StagingBuffers`` builds from the same host batch, whatever the batch
sizes do from step to step, and greedy tokens must not change (the end-to-end equality tests
of batching, preemption and prefix caching run through the same runner).
"""

from __future__ import annotations

import random

import torch

from localchat.engine.step_inputs import BatchEntry, StagingBuffers, flatten_batch

BLOCK = 16


def _entries(rng: random.Random, num_seqs: int, decode: bool) -> list[BatchEntry]:
    out = []
    for _ in range(num_seqs):
        start = rng.randrange(0, 100)
        n = 1 if decode else rng.randrange(1, 40)
        blocks = rng.sample(range(1, 200), -(-(start + n) // BLOCK))
        ids = [rng.randrange(0, 50_000) for _ in range(n)]
        out.append(BatchEntry(blocks, start, ids, rng.choice(["last", "none", "all"])))
    return out


def _as_lists(result):
    ids, pos, meta, index = result
    return (ids.tolist(), pos.tolist(), meta.slot_mapping.tolist(), meta.block_tables.tolist(),
            meta.seq_lens.tolist(), meta.query_start_loc.tolist(), meta.max_query_len,
            meta.max_seq_len, None if index is None else index.tolist())


def test_persistent_views_equal_fresh_buffers_across_changing_batches():
    rng = random.Random(0)
    persistent = StagingBuffers(torch.device("cpu"), slots=3, persistent=True)
    # layouts that repeat (pure decode at 1 and 4 sequences) and change (prefill chunks,
    # batch size going up and down, a block table growing past its width)
    plan = [(1, True)] * 5 + [(4, True)] * 4 + [(2, False), (1, True), (3, False)] \
        + [(4, True)] * 3 + [(1, True)] * 7
    for num_seqs, decode in plan:
        hb = flatten_batch(_entries(rng, num_seqs, decode), BLOCK)
        rows = [r for g in hb.row_groups for r in g]
        for logits_rows in (None, rows):
            got = persistent.to_device(hb, logits_rows)
            want = StagingBuffers(torch.device("cpu"), slots=1).to_device(hb, logits_rows)
            assert _as_lists(got) == _as_lists(want)
            assert got[0].dtype == got[2].block_tables.dtype == torch.int64
            assert got[2].block_tables.shape == (hb.num_seqs, hb.width)


def test_a_repeated_layout_reuses_the_slot_views_with_new_values():
    staging = StagingBuffers(torch.device("cpu"), slots=1, persistent=True)
    first = staging.to_device(flatten_batch([BatchEntry([3, 5], 20, [7], "last")], BLOCK))
    second = staging.to_device(flatten_batch([BatchEntry([3, 5], 21, [9], "last")], BLOCK))
    assert second[0] is first[0]  # the same view, rewritten in place
    assert second[0].tolist() == [9] and second[1].tolist() == [21]
    assert second[2].slot_mapping.tolist() == [5 * BLOCK + 5]
    assert second[2].seq_lens.tolist() == [22]
    # a non-persistent ring hands out fresh tensors: earlier steps keep their values
    fresh = StagingBuffers(torch.device("cpu"), slots=1)
    a = fresh.to_device(flatten_batch([BatchEntry([3], 2, [7], "last")], BLOCK))
    fresh.to_device(flatten_batch([BatchEntry([3], 3, [8], "last")], BLOCK))
    assert a[0].tolist() == [7]
