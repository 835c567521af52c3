"""CUDA graphs for decode steps: capture the model's forward once per batch size, replay it.

At batch 1 a decode step of a 8B model launches ~10 kernels per layer; on a GPU the CPU cost
of launching them (Python, the Triton launchers) exceeds their run time, so decode is captured
into CUDA graphs (one per padded batch size, 1, 2, 4, 8, 16, 32 by default) and replayed with
one launch. Inputs live in static buffers; a step with ``n`` sequences copies its tensors into
the first ``n`` rows and replays the smallest captured size ``>= n``; the padding rows write
nothing (``slot_mapping = -1``) and attend to one token of block 0, and their outputs are
dropped. Steps that are not pure decode, or larger than the largest captured size, or whose
block tables are wider than the static one, run eagerly. All static inputs live in one packed
device buffer that one pinned host-to-device copy fills per step. Graphs are captured only when
every op in the step is graph-safe (``graph_unsafe_reason``). Reference design: vLLM's
``CUDAGraphRunner`` / gpt-fast's ``torch.cuda.graph`` decode.

On a device without CUDA graphs (CPU) ``capture`` records nothing and ``forward`` runs the
same padded static-buffer path eagerly, which keeps the padding logic testable everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .attention_metadata import AttentionMetadata, seq_len_bucket
from .step_inputs import HostBatch, StagingBuffers

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def graph_unsafe_reason(model: nn.Module) -> str | None:
    """Why capturing ``model``'s decode step would not be safe, or ``None`` when it is.

    Every op inside a capture must run without reading device values on the host. The
    PyTorch reference kernels do (``.tolist()``/``bool()`` over ``seq_lens``), so graphs need
    the Triton kernels: not under ``LOCALCHAT_KERNELS=reference`` nor without Triton. (The
    linear methods, the model code and the Triton launchers are sync-free: the CPU capture
    check in ``tests/engine/test_cuda_graphs.py`` proves it under a mode that raises on any
    host read.)
    """
    from localchat import kernels

    if not kernels.triton_available():
        return ("the PyTorch reference kernels read device values on the host "
                "(LOCALCHAT_KERNELS=reference or Triton missing)")
    return None


class CudaGraphRunner:
    """Decode-step CUDA graphs over a model with the ``LlamaForCausalLM.forward`` signature.

    Args:
        model: ``forward(input_ids [T] int64, positions [T] int64, kv_caches, attn_metadata)
            -> hidden [T, hidden_size]``.
        kv_caches: per layer ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (the
            tensors the graphs read and write; never reallocated afterwards).
        max_num_blocks_per_seq: width of the static block table, ``ceil(max_model_len /
            block_size)``.
        batch_sizes: decode batch sizes (sequences) to capture.
        device: where the model runs.
        use_graphs: capture and replay graphs (default: when ``device`` is CUDA); ``False``
            runs the same static-buffer path eagerly. (The CPU capture check sets it with
            ``torch.cuda``'s graph API faked.)

    Graphs are keyed by ``(padded batch size, length bucket)``: the decode kernel sizes its
    split-K partitions from the bucket of the longest sequence (``seq_len_bucket``), a launch
    parameter a graph freezes, so each bucket gets its own graph; ``capture`` records the
    smallest bucket for every batch size, longer buckets are captured the first time a step
    needs them (a few ms, once per bucket and size; ``log2(max_model_len / 256)`` buckets).

    Usage (the model runner): ``runner.capture()`` once after loading and allocating the KV
    cache; then each decode step ``runner.replay_batch(host_batch, staging)`` (inputs packed on
    the host, one copy into the static buffers) or ``runner.forward(input_ids, positions,
    attn_metadata)`` with device tensors. The returned rows are a view into a static buffer,
    valid until the next call: compute logits from them before the next step.
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor],
                 max_num_blocks_per_seq: int, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                 device: torch.device | str | None = None, use_graphs: bool | None = None
                 ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {batch_sizes}")
        self.model = model
        self.kv_caches = kv_caches
        self.device = torch.device(device) if device is not None else kv_caches[0].device
        self.batch_sizes = sorted({int(b) for b in batch_sizes})
        self.max_batch_size = self.batch_sizes[-1]
        self.max_num_blocks_per_seq = int(max_num_blocks_per_seq)
        self.block_size = int(kv_caches[0].shape[2])
        self.max_seq_len = self.max_num_blocks_per_seq * self.block_size
        n, w = self.max_batch_size, self.max_num_blocks_per_seq
        # One packed int64 buffer holds every static input (one copy per step fills it):
        # input_ids [n] | positions [n] | slot_mapping [n] | seq_lens [n] |
        # query_start_loc [n + 1] | block_tables [n, w] | logits rows [n]
        self._sizes = [n, n, n, n, n + 1, n * w, n]
        self.static = torch.zeros(sum(self._sizes), dtype=torch.int64, device=self.device)
        (self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.query_start_loc,
         tables, self.logits_index) = self.static.split(self._sizes)
        self.block_tables = tables.view(n, w)
        self.query_start_loc.copy_(torch.arange(n + 1, dtype=torch.int64, device=self.device))
        self._reset_padding(0)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self._pool = None

    def bucket(self, max_seq_len: int | None) -> int:
        """The length bucket (tokens) a step whose sequences are at most ``max_seq_len``
        tokens long replays (``None``: the static table's whole width)."""
        if max_seq_len is None:
            return self.max_seq_len
        return min(seq_len_bucket(max_seq_len), self.max_seq_len)

    def _metadata(self, batch_size: int, bucket: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch_size],
            block_tables=self.block_tables[:batch_size],
            seq_lens=self.seq_lens[:batch_size],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            max_query_len=1,
            max_seq_len=bucket,
        )

    def _run_static(self, batch_size: int, bucket: int) -> torch.Tensor:
        return self.model(self.input_ids[:batch_size], self.positions[:batch_size],
                          self.kv_caches, self._metadata(batch_size, bucket))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per batch size at the smallest length bucket (largest size
        first, all sharing one memory pool). No-op unless ``use_graphs``."""
        if not self.use_graphs:
            return
        self._pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.batch_sizes):
            self._capture(bs, self.bucket(1))
        torch.cuda.synchronize(self.device)

    def _capture(self, bs: int, bucket: int) -> None:
        """Capture ``(bs, bucket)`` over the static buffers in their padding state (slot -1,
        seq_len 1: the warm-up runs write nothing to the KV cache). Each key runs eagerly
        twice on a side stream first (Triton compiles its kernels and cuBLAS picks its
        algorithms outside the capture); the static inputs are restored afterwards."""
        saved = self.static.clone()
        self._reset_padding(0)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run_static(bs, bucket)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.outputs[bs, bucket] = self._run_static(bs, bucket)
        self.graphs[bs, bucket] = graph
        self.static.copy_(saved)

    def _reset_padding(self, start: int) -> None:
        """Rows ``start:`` become padding: no KV write, one token of block 0."""
        self.input_ids[start:].zero_()
        self.positions[start:].zero_()
        self.slot_mapping[start:].fill_(-1)
        self.block_tables[start:].zero_()
        self.seq_lens[start:].fill_(1)

    def padded_batch_size(self, num_seqs: int) -> int | None:
        """Smallest captured batch size ``>= num_seqs``, or None when there is none."""
        for bs in self.batch_sizes:
            if bs >= num_seqs:
                return bs
        return None

    def can_replay(self, input_ids: torch.Tensor, attn_metadata: AttentionMetadata) -> bool:
        """Whether this step is a pure decode step that fits the static buffers."""
        return (attn_metadata.is_decode_only
                and input_ids.shape[0] == attn_metadata.num_seqs
                and self.padded_batch_size(attn_metadata.num_seqs) is not None
                and attn_metadata.block_tables.shape[1] <= self.max_num_blocks_per_seq)

    def can_replay_batch(self, hb: HostBatch) -> bool:
        """``can_replay`` for a step still on the host."""
        return (hb.is_decode_only and len(hb.input_ids) == hb.num_seqs
                and self.padded_batch_size(hb.num_seqs) is not None
                and hb.width <= self.max_num_blocks_per_seq)

    def _launch(self, n: int, bucket: int) -> torch.Tensor:
        bs = self.padded_batch_size(n)
        if not self.use_graphs:
            return self._run_static(bs, bucket)[:n]
        if (bs, bucket) not in self.graphs:
            self._capture(bs, bucket)
        self.graphs[bs, bucket].replay()
        return self.outputs[bs, bucket][:n]

    @torch.inference_mode()
    def replay_batch(self, hb: HostBatch, staging: StagingBuffers,
                     logits_rows: list[int] | None = None):
        """Run a decode step given on the host: pack the whole static layout (padding rows
        included) into a pinned staging buffer, copy it into the static inputs with one
        asynchronous copy, replay. Returns ``(hidden [num_seqs, hidden_size] view,
        logits_index)``; ``logits_index`` (``[len(logits_rows)]`` int64 on the device) is
        ``None`` without ``logits_rows``. Raises ``ValueError`` unless
        ``can_replay_batch(hb)``."""
        if not self.can_replay_batch(hb):
            raise ValueError("not a decode step that fits the captured batch sizes")
        n, w, big = hb.num_seqs, self.max_num_blocks_per_seq, self.max_batch_size
        slot, buf = staging.take(self.static.numel())
        host = buf[: self.static.numel()]
        view = host.numpy()
        view[:] = 0
        o = [0]
        for size in self._sizes:
            o.append(o[-1] + size)
        view[o[0]: o[0] + n] = hb.input_ids
        view[o[1]: o[1] + n] = hb.positions
        view[o[2]: o[2] + n] = hb.slot_mapping
        view[o[2] + n: o[3]] = -1
        view[o[3]: o[3] + n] = hb.seq_lens
        view[o[3] + n: o[4]] = 1
        view[o[4]: o[5]] = range(big + 1)
        tables = view[o[5]: o[6]].reshape(big, w)
        for i, row in enumerate(hb.block_tables):
            tables[i, : len(row)] = row
        rows = logits_rows or []
        view[o[6]: o[6] + len(rows)] = rows
        staging.copy(slot, host, dst=self.static)
        out = self._launch(n, self.bucket(hb.max_seq_len))
        return out, (self.logits_index[: len(rows)] if logits_rows is not None else None)

    @torch.inference_mode()
    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor,
               attn_metadata: AttentionMetadata) -> torch.Tensor:
        """Run a decode step given as device tensors through the static buffers (a graph
        replay when ``use_graphs``).

        Args:
            input_ids, positions: ``[num_seqs]`` int64, one token per sequence.
            attn_metadata: that step's metadata (``max_query_len == 1``; its
                ``max_seq_len`` picks the length bucket, ``None`` the widest).

        Returns:
            ``[num_seqs, hidden_size]``, a view into a static buffer (valid until the next
            call).

        Raises:
            ValueError: when ``can_replay`` is false for this step.
        """
        if not self.can_replay(input_ids, attn_metadata):
            raise ValueError("not a decode step that fits the captured batch sizes")
        n = input_ids.shape[0]
        width = attn_metadata.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(attn_metadata.slot_mapping)
        self.block_tables[:n, :width].copy_(attn_metadata.block_tables)
        self.block_tables[:n, width:].zero_()
        self.seq_lens[:n].copy_(attn_metadata.seq_lens)
        self._reset_padding(n)
        return self._launch(n, self.bucket(attn_metadata.max_seq_len))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """``replay`` when the step fits, else the eager ``model(...)`` (prefill, mixed
        batches, more sequences than the largest captured size). Returns
        ``[num_tokens, hidden_size]``."""
        if self.can_replay(input_ids, attn_metadata):
            return self.replay(input_ids, positions, attn_metadata)
        with torch.inference_mode():
            return self.model(input_ids, positions, self.kv_caches, attn_metadata)
