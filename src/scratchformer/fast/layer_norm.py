"""LayerNorm with its backward pass written out: the same values as
:class:`scratchformer.core.layer_norm.LayerNorm`, in fewer passes over memory.

Autograd's chain through mean, variance and square root takes about twice the passes. With
x_hat = (x - mean) * rstd, rstd = 1/sqrt(var + eps), and g = dL/dy * gamma, per row of D values:

    dL/dbeta  = sum over rows of dL/dy
    dL/dgamma = sum over rows of dL/dy * x_hat
    dL/dx     = rstd * (g - mean(g) - x_hat * mean(g * x_hat))

The forward computes the statistics in two plain passes (on CPU 1.7-5x faster than
``torch.var_mean``'s kernel) and applies gamma and beta in one ``addcmul``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from scratchformer.core.checks import check_features
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["FastLayerNorm"]


def _normalize(h: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x_hat, rstd): h (..., D) centred and scaled to unit variance, and 1 / sqrt(var + eps) (..., 1)."""
    centred = h - h.mean(dim=-1, keepdim=True)
    rstd = torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)  # biased variance
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


class FastLayerNorm(LayerNorm):
    """:class:`LayerNorm` (same parameters) with the hand-written backward and a fused affine."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        check_features("x", x, "(..., D)", self.weight.shape[0], dims=None)
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # statistics in fp32
        weight, bias = self.weight.to(h.dtype), self.bias.to(h.dtype)
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad or bias.requires_grad):
            return _LayerNormFunction.apply(h, weight, bias, self.eps).to(x.dtype)
        return torch.addcmul(bias, _normalize(h, self.eps)[0], weight).to(x.dtype)
