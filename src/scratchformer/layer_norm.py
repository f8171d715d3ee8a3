"""Layer normalization (Ba et al., 2016), written out.

    y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

over the last dimension, with the biased variance and eps inside the square root, exactly as
``torch.nn.LayerNorm``. Statistics of fp16/bf16 inputs are computed in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scratchformer.validation import check_last_dim

__all__ = ["LayerNorm"]


class LayerNorm(nn.Module):
    """Normalize the last dimension D to zero mean and unit variance, then scale and shift.

    Args:
        d_model: D, the size of the normalized (last) dimension.
        eps: added to the variance inside the square root (1e-5 as PyTorch; BERT uses 1e-12).
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        check_last_dim("x", x, self.weight.shape[0])
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # fp16/bf16: stats in fp32
        var, mean = torch.var_mean(h, dim=-1, correction=0, keepdim=True)  # biased: divide by D
        h = (h - mean) * torch.rsqrt(var + self.eps)
        # gamma * h + beta in one pass (speed: each full-size elementwise op is a trip through memory)
        return torch.addcmul(self.bias.to(h.dtype), h, self.weight.to(h.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
