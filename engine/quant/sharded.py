"""A fused layer whose shards keep different stored layouts: one sub-method per shard.

The ``native`` format (``native.py``) holds each GGUF tensor in the layout its type repacks
onto. A fused layer (``qkv_proj`` = q | k | v, ``gate_up_proj`` = gate | up) whose shards
repack onto *different* layouts (Qwen2.5-Coder-1.5B: q, k Q4_K -> int4 groups of 32 with
mins; v Q6_K -> int8 groups of 16) would otherwise be widened to one layout that holds every
shard (int8, groups of 16, mins: ~12 bits per weight where the file holds 4.5).
:class:`ShardedLinearMethod` instead keeps each shard in its own layout, in a child module
``shard_<id>`` of the layer (``shard_q``, ``shard_k``, ``shard_v``; ``shard_0``, ``shard_1``)
holding that shard's ``qweight`` / ``scales`` / ``mins`` buffers, so the state dict, the
quantized-weight cache (``cache.py``, safetensors, memory-mapped reads) and the device
repacks see ordinary per-module buffers (``...qkv_proj.shard_v.qweight``).

``apply(layer, x [..., K]) -> [..., N]`` runs each shard's own method (its own CPU / CUDA
kernels) on ``x`` and concatenates the ``[..., N_i]`` outputs along the last dim in shard
order, then adds the fused layer's bias ``[N]``: the same values as one matmul over the
stacked weight (each output column is one shard's dot product; only the kernel computing it
differs). Reference design: llama.cpp keeps ``attn_q``, ``attn_k`` and ``attn_v`` as separate
tensors, each in its own type, and multiplies them one by one; vLLM's
``MergedColumnParallelLinear`` / ``QKVParallelLinear`` hold every shard in one layout (what
layers whose shards agree still do here).
"""

from __future__ import annotations

import torch
from torch import nn

from .methods import LinearMethod, _add_bias
from .schemes import QuantScheme


class ShardLayer(nn.Module):
    """One shard of a :class:`ShardedLinearMethod` layer: the attributes a linear method reads
    (``in_features``, ``out_features`` = the shard's rows, ``bias`` None: the fused layer adds
    it) and the buffers its method's ``create_weights`` registers. Not a ``Linear``: it is
    never called on its own, only through the fused layer's ``apply``."""

    def __init__(self, in_features: int, out_features: int, method: LinearMethod) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = None
        self.weight_t = None
        self.bias = None
        self.quant_method = method
        self._processed = False

    def process_weights_after_loading(self) -> None:
        """The shard method's device conversion, once (the loaders call it for every module
        that has it, the fused layer's method calls it too; converting twice would e.g.
        repack an already repacked int4 weight)."""
        if not self._processed:
            self.quant_method.process_weights_after_loading(self)
            self._processed = True


class ShardedLinearMethod(LinearMethod):
    """Shards of one fused layer, each stored and multiplied by its own method.

    ``shards``: ``[(shard_id, rows, method)]`` in output order (``q, k, v`` or ``0, 1``):
    ``rows`` output features of shard ``shard_id`` (they sum to the layer's
    ``out_features``), ``method`` the linear method that shard alone would get.
    Raises ``ValueError`` for fewer than two shards.
    """

    scheme = QuantScheme.NATIVE

    def __init__(self, shards: list[tuple[str | int, int, LinearMethod]]) -> None:
        if len(shards) < 2:
            raise ValueError(f"a sharded layer needs at least two shards, got {len(shards)}")
        self.shards = list(shards)
        self.offsets = [0]
        for _, rows, _ in self.shards:
            self.offsets.append(self.offsets[-1] + rows)

    @staticmethod
    def child_name(shard_id: str | int) -> str:
        """The child module holding shard ``shard_id``'s buffers (``shard_q``, ``shard_0``)."""
        return f"shard_{shard_id}"

    def children(self, layer: nn.Module) -> list[ShardLayer]:
        """``layer``'s shard modules, in output order."""
        return [getattr(layer, self.child_name(sid)) for sid, _, _ in self.shards]

    def create_weights(self, layer, device):
        if self.offsets[-1] != layer.out_features:
            ids = [sid for sid, _, _ in self.shards]
            raise ValueError(f"shards {ids} hold {self.offsets[-1]} rows, the layer "
                             f"{layer.out_features}: a shard is missing")
        layer.weight = None
        for sid, rows, method in self.shards:
            child = ShardLayer(layer.in_features, rows, method)
            method.create_weights(child, device)
            layer.add_module(self.child_name(sid), child)

    def process_weights_after_loading(self, layer):
        for child in self.children(layer):
            child.process_weights_after_loading()

    def locate(self, layer: nn.Module, start: int, end: int) -> tuple[nn.Module, int, int]:
        """The shard module holding the fused layer's output rows ``[start, end)``, and the
        rows relative to it. Raises ``ValueError`` when they are not inside one shard."""
        for child, a, b in zip(self.children(layer), self.offsets, self.offsets[1:]):
            if a <= start and end <= b:
                return child, start - a, end - a
        raise ValueError(f"rows [{start}, {end}) span shards at {self.offsets}")

    def exact_cpu_rows(self, layer):
        return all(child.quant_method.exact_cpu_rows(child) for child in self.children(layer))

    def short_prefill_rows(self, layer):
        return min(child.quant_method.short_prefill_rows(child) for child in self.children(layer))

    def decode_plan(self, layer, dtype):
        parts = []
        for child in self.children(layer):
            plan = child.quant_method.decode_plan(child, dtype)
            if plan is None or plan[1] is not None:
                return None
            parts += plan[0]
        return parts, layer.bias

    def apply(self, layer, x):
        ys = [child.quant_method.apply(child, x) for child in self.children(layer)]
        return _add_bias(torch.cat(ys, dim=-1), layer.bias)

    def weight_bytes(self, out_features, in_features, dtype):
        if out_features != self.offsets[-1]:
            raise ValueError(f"shards hold {self.offsets[-1]} rows, asked for {out_features}")
        return sum(method.weight_bytes(rows, in_features, dtype)
                   for _, rows, method in self.shards)
