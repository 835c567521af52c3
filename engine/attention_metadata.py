"""Per-step tensors every attention layer reads (built once per step by the model runner)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SEQ_LEN_BUCKET = 256  # tokens


def seq_len_bucket(n: int) -> int:
    """The length bucket of a ``n``-token sequence: the next power of two ``>= n`` (at least
    ``MIN_SEQ_LEN_BUCKET``). Decode split-K is sized from it (not from the block table's
    width, ``max_model_len``), and CUDA graphs are captured per bucket, so a bucket never
    overstates the real length by more than 2x and there are only ``log2`` of them."""
    n = max(int(n), MIN_SEQ_LEN_BUCKET)
    return 1 << (n - 1).bit_length()


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the paged KV cache and what each one attends to.

    Attributes:
        slot_mapping: ``[num_tokens]`` int64, flat cache slot
            (``block_id * block_size + offset``) of each new token.
        block_tables: ``[num_seqs, max_num_blocks_per_seq]`` int64 block ids per sequence
            (padded with 0 past a sequence's last block).
        seq_lens: ``[num_seqs]`` int64 tokens per sequence after this step
            (cached prefix + new tokens).
        query_start_loc: ``[num_seqs + 1]`` int64 cumulative new-token counts.
        max_query_len: the longest query chunk this step (1 means a pure decode step).
        max_seq_len: host-side upper bound (tokens) of ``seq_lens``, a
            :func:`seq_len_bucket` of the real longest sequence; the decode kernel sizes its
            split-K partitions from it (``None``: the block table's width bounds it).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
