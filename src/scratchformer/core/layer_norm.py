"""Layer normalization (Ba et al., 2016), written out:

    y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

over the last dimension, biased variance, eps inside the root (as ``torch.nn.LayerNorm``); fp16/bf16
statistics in float32. :class:`scratchformer.fast.FastLayerNorm` computes the same with ATen's fused kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_features

__all__ = ["LayerNorm"]


class LayerNorm(nn.Module):
    """Normalize the last dimension D to zero mean and unit variance, then scale and shift;
    ``eps`` is added inside the square root (1e-5 as PyTorch; BERT uses 1e-12)."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        check_features("x", x, "(..., D)", self.weight.shape[0], dims=None)
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # statistics in fp32
        mean = h.mean(dim=-1, keepdim=True)
        var = (h - mean).square().mean(dim=-1, keepdim=True)  # biased: divide by D
        x_hat = (h - mean) / torch.sqrt(var + self.eps)
        return (x_hat * self.weight.to(h.dtype) + self.bias.to(h.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
