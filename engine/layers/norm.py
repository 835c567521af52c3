"""RMSNorm layer (Zhang & Sennrich 2019) over ``localchat.kernels``."""

from __future__ import annotations

import torch
from torch import nn

from localchat import kernels


class RMSNorm(nn.Module):
    """``weight [hidden_size]``; forward on ``x [..., hidden_size]``.

    ``forward(x, residual)`` fuses the residual add: returns ``(normed, x + residual)``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps)
        return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
