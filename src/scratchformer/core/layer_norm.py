"""Layer normalization (Ba et al., 2016), written out, forward and backward.

    y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

over the last dimension, with the biased variance and eps inside the square root, exactly as
``torch.nn.LayerNorm``. Statistics of fp16/bf16 inputs are computed in float32.

The backward pass is written out too (autograd's chain through mean, variance and square root
takes about twice the passes over memory). With x_hat = (x - mean) * rstd, rstd = 1/sqrt(var + eps),
and g = dL/dy * gamma, the gradients are, per row of D values:

    dL/dbeta  = sum over rows of dL/dy
    dL/dgamma = sum over rows of dL/dy * x_hat
    dL/dx     = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from scratchformer.core.checks import check_last_dim

__all__ = ["LayerNorm"]


def _normalize(h: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x_hat, rstd): h (..., D) centred and scaled to unit variance, and 1 / sqrt(var + eps) (..., 1)."""
    centred = h - h.mean(dim=-1, keepdim=True)
    # biased variance (divide by D), two-pass; on CPU this beats torch.var_mean's kernel 1.7-5x
    rstd = torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
    return centred * rstd, rstd


class _LayerNormFunction(torch.autograd.Function):
    """LayerNorm with the hand-derived backward of the module docstring."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        x_hat, rstd = _normalize(h, eps)
        ctx.save_for_backward(x_hat, rstd, weight)
        return torch.addcmul(bias, x_hat, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        x_hat, rstd, weight = ctx.saved_tensors
        need_x, need_weight, need_bias, _ = ctx.needs_input_grad
        rows = grad.reshape(-1, grad.shape[-1])
        grad_bias = rows.sum(0) if need_bias else None
        grad_weight = (rows * x_hat.reshape(rows.shape)).sum(0) if need_weight else None
        grad_x = None
        if need_x:
            g = grad * weight
            grad_x = (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) * rstd
        return grad_x, grad_weight, grad_bias, None


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
        weight, bias = self.weight.to(h.dtype), self.bias.to(h.dtype)
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad or bias.requires_grad):
            return _LayerNormFunction.apply(h, weight, bias, self.eps).to(x.dtype)
        x_hat, _ = _normalize(h, self.eps)
        # gamma * x_hat + beta in one pass (each full-size elementwise op is a trip through memory)
        return torch.addcmul(bias, x_hat, weight).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
