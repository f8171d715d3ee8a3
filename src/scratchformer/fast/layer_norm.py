"""LayerNorm on ATen's fused kernel: the same values as
:class:`scratchformer.core.layer_norm.LayerNorm`, in one pass over memory instead of five or more.

The core module writes the formula out (mean, variance, centre, scale, shift: each a pass over
the (..., D) tensor, and as many again in autograd's backward). ``F.layer_norm`` computes the
same thing in one fused kernel, forward and backward, with fp32 statistics for bf16/fp16 inputs
(and fp32 gamma and beta applied in fp32, as the core module does). On CPU it is 5-20x faster
than the written-out formula, which matters most in bf16, where the matmuls around it are cheap.
The core module stays the readable reference; tests/test_fast.py holds the two equal.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.checks import check_features
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["FastLayerNorm"]

_HALF = (torch.float16, torch.bfloat16)


class FastLayerNorm(LayerNorm):
    """:class:`LayerNorm` (same parameters) computed by ``torch.nn.functional.layer_norm``."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D), in x's dtype."""
        check_features("x", x, "(..., D)", self.weight.shape[0], dims=None)
        weight, bias = self.weight, self.bias
        if not (x.dtype in _HALF and weight.dtype == torch.float32):  # else: fp32 affine on fp16/bf16 input
            weight, bias = weight.to(x.dtype), bias.to(x.dtype)
        return F.layer_norm(x, self.weight.shape, weight, bias, self.eps)
