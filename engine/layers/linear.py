"""Linear layers with fused projections (vLLM's QKV / merged column layout).

``QKVLinear`` stacks ``q_proj, k_proj, v_proj`` and ``MergedLinear`` stacks e.g.
``gate_proj, up_proj`` along the output dim, so one GEMM serves several HF projections. Each
layer knows how to copy one HF shard into its slice (``load_shard``). The float weight layout is
``[out_features, in_features]`` as in ``torch.nn.Linear``. How the weight is stored and
multiplied once loaded is the job of the layer's ``quant_method`` (``engine/quant/methods.py``):
the unquantized method by default, int8 / int4 / fp8 when the loader sets one.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from localchat import kernels

from ..quant.methods import LinearMethod


class Linear(nn.Module):
    """``y = x @ weight.T + bias``; ``x [num_tokens, in_features]`` -> ``[num_tokens, out]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        )
        # CPU fp32 keeps the weight transposed, [in_features, out_features] (see
        # process_weights_after_loading); None elsewhere.
        self.weight_t: torch.Tensor | None = None
        # How the weight is stored and applied; the loader swaps in a quantized method.
        self.quant_method: LinearMethod = LinearMethod()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.short_prefill_chunks(x) and \
                x.shape[0] <= self.quant_method.short_prefill_rows(self):
            # a short fp32 prefill: chunks of decode rows on the exact C++ kernels (also inside
            # an a8_fp32 engine step: prompts stay fp32-exact, a draft's aside), not a GEMM
            # over every weight dequantized
            with kernels.a8_fp32(enabled=False) if kernels.exact_prompts() \
                    else contextlib.nullcontext():
                return torch.cat([self.quant_method.apply(self, c)
                                  for c in x.split(kernels.CPU_MAX_ROWS)])
        return self.quant_method.apply(self, x)

    def process_weights_after_loading(self) -> None:
        """Convert the loaded weight to the layout the device's kernel reads fastest, once all
        shards are in (the quant method's job; e.g. fp32 on CPU keeps ``weight_t [in, out]``)."""
        self.quant_method.process_weights_after_loading(self)

    def shard_range(self, shard_id: str | int | None) -> tuple[int, int]:
        """Output rows ``[start, end)`` that HF shard ``shard_id`` occupies."""
        return 0, self.out_features

    def load_shard(self, name: str, tensor: torch.Tensor, shard_id: str | int | None) -> None:
        """Copy HF tensor ``tensor`` (``[rows, in]`` weight or ``[rows]`` bias) into the slice
        of parameter ``name`` ("weight" or "bias") for ``shard_id``.

        Raises ``ValueError`` on a shape mismatch.
        """
        param = getattr(self, name)
        if param is None:
            raise ValueError(f"layer has no {name} but the checkpoint provides one")
        start, end = self.shard_range(shard_id)
        target = param.data[start:end]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"shape mismatch for {name} shard {shard_id}: checkpoint {tuple(tensor.shape)}, "
                f"model {tuple(target.shape)}"
            )
        target.copy_(tensor)


class QKVLinear(Linear):
    """Fused ``q_proj | k_proj | v_proj``: output ``[num_tokens, q_size + 2 * kv_size]`` where
    ``q_size = num_heads * head_dim`` and ``kv_size = num_kv_heads * head_dim``."""

    def __init__(self, hidden_size: int, q_size: int, kv_size: int, bias: bool = False) -> None:
        super().__init__(hidden_size, q_size + 2 * kv_size, bias)
        self.q_size = q_size
        self.kv_size = kv_size

    def shard_range(self, shard_id: str | int | None) -> tuple[int, int]:
        q, kv = self.q_size, self.kv_size
        return {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[shard_id]


class MergedLinear(Linear):
    """Several equally-shaped projections stacked on the output dim (``gate_up_proj``)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        super().__init__(in_features, sum(out_sizes), bias)
        self.offsets = [0]
        for size in out_sizes:
            self.offsets.append(self.offsets[-1] + size)

    def shard_range(self, shard_id: str | int | None) -> tuple[int, int]:
        i = int(shard_id)
        return self.offsets[i], self.offsets[i + 1]
