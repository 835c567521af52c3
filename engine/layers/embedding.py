"""Token embedding that may be stored quantized, and doubles as the tied LM head.

``VocabEmbedding`` is a ``Linear`` of ``[vocab_size, hidden_size]`` (the shape of
``nn.Embedding.weight`` and of the LM head), so the loader gives it a linear method like any
projection: the float method, or a native GGUF layout (``engine/quant/native.py``). The lookup
dequantizes only the rows it reads; ``logits`` multiplies through the method, so a tied model
holds one tensor for both. Reference design: vLLM's ``VocabParallelEmbedding`` with a
quantization method, and llama.cpp's ``get_rows`` on quantized ``token_embd``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant.methods import LinearMethod
from .linear import Linear


class VocabEmbedding(Linear):
    """``forward(input_ids [num_tokens] int64) -> [num_tokens, hidden_size]`` (the float
    weight's dtype, or fp32 from a quantized layout); ``logits(hidden [n, hidden_size]) -> [n, vocab_size]`` in hidden's dtype."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(hidden_size, vocab_size)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.embedding(input_ids, self.weight)
        return self.quant_method.embed(self, input_ids, torch.float32)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # through the layer's method, float included (its batch-invariant CPU matmul)
        return self.quant_method.apply(self, hidden_states)

    def process_weights_after_loading(self) -> None:
        """The float weight stays ``[V, H]`` (rows are gathered); quantized methods convert as
        for any layer."""
        if type(self.quant_method) is not LinearMethod:
            self.quant_method.process_weights_after_loading(self)
