"""CUDA graphs for decode steps: capture the model's forward once per batch size, replay it.

At batch 1 a decode step of a 8B model launches ~10 kernels per layer; on a GPU the CPU cost
of launching them (Python, the Triton launchers) exceeds their run time, so decode is captured
into CUDA graphs (one per padded batch size, 1, 2, 4, 8, 16, 32 by default) and replayed with
one launch. Inputs live in static buffers; a step with ``n`` sequences copies its tensors into
the first ``n`` rows and replays the smallest captured size ``>= n``; the padding rows write
nothing (``slot_mapping = -1``) and attend to one token of block 0, and their outputs are
dropped. Steps that are not pure decode, or larger than the largest captured size, or whose
block tables are wider than the static one, run eagerly. Reference design: vLLM's
``CUDAGraphRunner`` / gpt-fast's ``torch.cuda.graph`` decode.

On a device without CUDA graphs (CPU) ``capture`` records nothing and ``forward`` runs the
same padded static-buffer path eagerly, which keeps the padding logic testable everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .attention_metadata import AttentionMetadata

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


class CudaGraphRunner:
    """Decode-step CUDA graphs over a model with the ``LlamaForCausalLM.forward`` signature.

    Args:
        model: ``forward(input_ids [T] int64, positions [T] int64, kv_caches, attn_metadata)
            -> hidden [T, hidden_size]``.
        kv_caches: per layer ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (the
            tensors the graphs read and write; never reallocated afterwards).
        max_num_blocks_per_seq: width of the static block table, ``ceil(max_model_len /
            block_size)``; the decode kernel sizes its split-K partitions from it.
        batch_sizes: decode batch sizes (sequences) to capture.
        device: where the model runs; graphs are used only on CUDA.

    Usage (the model runner): ``runner.capture()`` once after loading and allocating the KV
    cache (and after any warm-up that compiles kernels); then each step
    ``hidden = runner.forward(input_ids, positions, attn_metadata)`` instead of
    ``model(...)``. The returned rows of a replay are a view into a static buffer, valid until
    the next call: compute logits from them before the next step.
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor],
                 max_num_blocks_per_seq: int, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                 device: torch.device | str | None = None) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {batch_sizes}")
        self.model = model
        self.kv_caches = kv_caches
        self.device = torch.device(device) if device is not None else kv_caches[0].device
        self.batch_sizes = sorted({int(b) for b in batch_sizes})
        self.max_batch_size = self.batch_sizes[-1]
        self.max_num_blocks_per_seq = int(max_num_blocks_per_seq)
        n, dev = self.max_batch_size, self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(n, self.max_num_blocks_per_seq, dtype=torch.int64,
                                        device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.use_graphs = self.device.type == "cuda"
        self._pool = None

    def _metadata(self, batch_size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch_size],
            block_tables=self.block_tables[:batch_size],
            seq_lens=self.seq_lens[:batch_size],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            max_query_len=1,
        )

    def _run_static(self, batch_size: int) -> torch.Tensor:
        return self.model(self.input_ids[:batch_size], self.positions[:batch_size],
                          self.kv_caches, self._metadata(batch_size))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per batch size (largest first, sharing one memory pool).

        Each size is run eagerly twice on a side stream first (Triton compiles its kernels
        and cuBLAS picks its algorithms outside the capture). The padding state (slot -1,
        seq_len 1) makes these runs write nothing to the KV cache. No-op without CUDA.
        """
        if not self.use_graphs:
            return
        self._reset_padding(0)
        self._pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.batch_sizes):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._run_static(bs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self.outputs[bs] = self._run_static(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

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

    @torch.inference_mode()
    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor,
               attn_metadata: AttentionMetadata) -> torch.Tensor:
        """Run a decode step through the static buffers (a graph replay on CUDA).

        Args:
            input_ids, positions: ``[num_seqs]`` int64, one token per sequence.
            attn_metadata: that step's metadata (``max_query_len == 1``).

        Returns:
            ``[num_seqs, hidden_size]``, a view into a static buffer (valid until the next
            call).

        Raises:
            ValueError: when ``can_replay`` is false for this step.
        """
        if not self.can_replay(input_ids, attn_metadata):
            raise ValueError("not a decode step that fits the captured batch sizes")
        n = input_ids.shape[0]
        bs = self.padded_batch_size(n)
        width = attn_metadata.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(attn_metadata.slot_mapping)
        self.block_tables[:n, :width].copy_(attn_metadata.block_tables)
        self.block_tables[:n, width:].zero_()
        self.seq_lens[:n].copy_(attn_metadata.seq_lens)
        self._reset_padding(n)
        if bs in self.graphs:
            self.graphs[bs].replay()
            return self.outputs[bs][:n]
        return self._run_static(bs)[:n]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """``replay`` when the step fits, else the eager ``model(...)`` (prefill, mixed
        batches, more sequences than the largest captured size). Returns
        ``[num_tokens, hidden_size]``."""
        if self.can_replay(input_ids, attn_metadata):
            return self.replay(input_ids, positions, attn_metadata)
        with torch.inference_mode():
            return self.model(input_ids, positions, self.kv_caches, attn_metadata)
