"""One step's flattened batch on the host, and its single copy to the device.

``flatten_batch`` turns the scheduled sequences into plain host lists (``HostBatch``: token
ids, positions, cache slots, block tables, lengths, the rows that need logits); nothing touches
the device. ``StagingBuffers.to_device`` then packs every integer of the step into one pinned
host buffer and copies it with one asynchronous host-to-device copy; the step's tensors are
views of that one device buffer (no pageable copies, no sync). The CUDA-graph runner fills its
own static inputs the same way (``CudaGraphRunner.replay_batch``). Reference design: vLLM's
``InputBatch`` with pinned CPU tensors copied ``non_blocking`` into persistent device buffers.
``build_batch`` does both for callers outside the step loop (tests, benchmarks); the target's
runner and the draft proposer both build their batches here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_metadata import AttentionMetadata, seq_len_bucket


@dataclass
class BatchEntry:
    """One sequence's slice of a flattened batch: ``token_ids`` at positions
    ``start, start + 1, ...`` written through ``block_ids``; ``rows``: which of its rows need
    logits ("last", "all" or "none")."""

    block_ids: list[int]
    start: int
    token_ids: list[int]
    rows: str


@dataclass
class HostBatch:
    """A flattened step on the host (python ints; shapes as the device tensors will have).

    ``input_ids``, ``positions``, ``slot_mapping``: ``[num_tokens]``; ``seq_lens``:
    ``[num_seqs]``; ``query_start_loc``: ``[num_seqs + 1]``; ``block_tables``: ``num_seqs``
    rows of ``width`` block ids (zero padded); ``row_groups[i]``: flat rows of sequence ``i``
    that need logits; ``max_seq_len``: ``seq_len_bucket`` of the longest sequence.
    """

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    seq_lens: list[int]
    query_start_loc: list[int]
    block_tables: list[list[int]]
    width: int
    max_query_len: int
    max_seq_len: int
    row_groups: list[list[int]]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def flatten_batch(entries: list[BatchEntry], block_size: int) -> HostBatch:
    """Flatten sequences into a ``HostBatch`` (``block_size``: tokens per KV block)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    qsl = [0]
    row_groups: list[list[int]] = []
    bs = block_size
    for e in entries:
        n = len(e.token_ids)
        end = e.start + n
        ids.extend(e.token_ids)
        positions.extend(range(e.start, end))
        table = e.block_ids
        slots.extend(table[p // bs] * bs + p % bs for p in range(e.start, end))
        seq_lens.append(end)
        qsl.append(qsl[-1] + n)
        if e.rows == "all":
            row_groups.append(list(range(qsl[-2], qsl[-1])))
        elif e.rows == "last":
            row_groups.append([qsl[-1] - 1])
        else:
            row_groups.append([])
    width = max(len(e.block_ids) for e in entries)
    tables = [e.block_ids + [0] * (width - len(e.block_ids)) for e in entries]
    return HostBatch(ids, positions, slots, seq_lens, qsl, tables, width,
                     max(len(e.token_ids) for e in entries), seq_len_bucket(max(seq_lens)),
                     row_groups)


class StagingBuffers:
    """A small ring of persistent host buffers (pinned on CUDA) for host-to-device copies.

    ``take(numel)`` returns a free int64 host buffer of at least ``numel`` elements; ``sent``
    records (on CUDA) an event after the copy that read it, and a buffer is reused only after
    its event completed, so several copies may be in flight without a sync per step (the
    draft's rounds within one step). On CPU the buffers are plain tensors and the "copy" is a
    clone, or with ``persistent=True`` the slot itself (see ``to_device``).
    """

    def __init__(self, device: torch.device, slots: int = 4, persistent: bool = False) -> None:
        self.device = torch.device(device)
        self._pin = self.device.type == "cuda"
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._events: list = [None] * slots
        self._next = 0
        # CPU with ``persistent``: the step's tensors are views of the slot's own buffer (no
        # clone), kept per slot while the step's layout (part sizes) repeats.
        self._persistent = persistent and self.device.type == "cpu"
        self._views: list[tuple | None] = [None] * slots

    def take(self, numel: int) -> tuple[int, torch.Tensor]:
        """``(slot, buffer)``: an int64 host buffer of ``>= numel`` elements, safe to write."""
        i = self._next
        self._next = (i + 1) % len(self._bufs)
        event = self._events[i]
        if event is not None:
            event.synchronize()  # done long ago in practice: the ring holds several steps
            self._events[i] = None
        buf = self._bufs[i]
        if buf is None or buf.numel() < numel:
            size = max(1024, 1 << (max(numel, 1) - 1).bit_length())
            buf = torch.empty(size, dtype=torch.int64, pin_memory=self._pin)
            self._bufs[i] = buf
        return i, buf

    def copy(self, slot: int, host: torch.Tensor, dst: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Copy ``host`` (a prefix of slot ``slot``'s buffer) to the device asynchronously;
        into ``dst`` when given (a persistent device buffer, e.g. a graph's static inputs),
        else into a fresh device tensor. Returns the device tensor (``host`` itself on CPU
        when no ``dst``)."""
        if dst is None:
            if self._persistent:
                return host  # views of the slot itself (see ``to_device``)
            if self.device.type == "cpu":
                return host.clone()  # the ring buffer is rewritten by later steps
            out = host.to(self.device, non_blocking=True)
        else:
            out = dst.copy_(host, non_blocking=True)
        if self._pin:
            event = torch.cuda.Event()
            event.record()
            self._events[slot] = event
        return out

    def to_device(self, hb: HostBatch, logits_rows: list[int] | None = None):
        """``(input_ids [T], positions [T], AttentionMetadata, logits_index)`` on the device
        from one packed copy. ``logits_index``: ``[len(logits_rows)]`` int64 device rows (to
        index the hidden states without a host index), ``None`` without ``logits_rows``.

        With ``persistent`` on CPU the tensors are views of the ring slot's buffer, valid
        until the slot comes round again (``slots`` calls later): the model runner uses a
        step's inputs within that step only. A step whose layout (tokens, sequences, block
        table width, logits rows) equals the slot's previous one reuses its views: the
        integers are written in place and no tensor op runs."""
        s, w = hb.num_seqs, hb.width
        rows = logits_rows or []
        parts = (hb.input_ids, hb.positions, hb.slot_mapping, hb.seq_lens,
                 hb.query_start_loc, [b for row in hb.block_tables for b in row], rows)
        sizes = tuple(len(p) for p in parts)
        total = sum(sizes)
        slot, buf = self.take(total)
        view = buf.numpy() if self._persistent else buf[:total].numpy()
        offset = 0
        for part, n in zip(parts, sizes):
            view[offset: offset + n] = part
            offset += n
        key = (sizes, w, buf.data_ptr())
        cached = self._views[slot] if self._persistent else None
        if cached is not None and cached[0] == key:
            chunks = cached[1]
        else:
            chunks = list(self.copy(slot, buf[:total]).split(sizes))
            chunks[5] = chunks[5].view(s, w)
            if self._persistent:
                self._views[slot] = (key, chunks)
        meta = AttentionMetadata(
            slot_mapping=chunks[2], block_tables=chunks[5], seq_lens=chunks[3],
            query_start_loc=chunks[4], max_query_len=hb.max_query_len,
            max_seq_len=hb.max_seq_len)
        return chunks[0], chunks[1], meta, (chunks[6] if logits_rows is not None else None)


def build_batch(entries: list[BatchEntry], block_size: int, device: torch.device,
                staging: StagingBuffers | None = None):
    """Flatten sequences into ``(input_ids [T] int64, positions [T] int64,
    AttentionMetadata, row_groups)`` on ``device`` (one packed host-to-device copy through
    ``staging``, pinned on CUDA); ``row_groups[i]`` lists the flat rows of entry ``i`` that
    need logits."""
    hb = flatten_batch(entries, block_size)
    staging = staging or StagingBuffers(device, slots=1)
    input_ids, positions, meta, _ = staging.to_device(hb)
    return input_ids, positions, meta, hb.row_groups
