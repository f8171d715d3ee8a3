"""LayerNorm on ATen's fused kernel: the same values as
:class:`scratchformer.core.layer_norm.LayerNorm`, in one pass over memory instead of five or more.

The core module writes the formula out (mean, variance, centre, scale, shift: each a pass over
the (..., D) tensor, and as many again in autograd's backward). ``F.layer_norm`` computes the
same thing in one fused kernel, forward and backward, with fp32 statistics for bf16/fp16 inputs
(and fp32 gamma and beta applied in fp32, as the core module does). On CPU it is 4.6x faster than
the written-out formula forward and 7-11x forward + backward (``benchmarks/fast_path_micro.py``),
which matters most in bf16, where the matmuls around it are cheap.
The core module stays the readable reference; tests/fast/test_fast.py holds the two equal.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.attention import HALF
from scratchformer.core.checks import check_features
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["FastLayerNorm"]


class FastLayerNorm(LayerNorm):
    """:class:`LayerNorm` (same parameters) computed by ``torch.nn.functional.layer_norm``."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D), in x's dtype (also under autocast, as the core module)."""
        check_features("x", x, "(..., D)", self.weight.shape[0], dims=None)
        weight, bias, shape = self.weight, self.bias, self.weight.shape
        if weight.dtype == x.dtype or (
            x.dtype in HALF and weight.dtype == torch.float32 and x.device.type == "cpu"
        ):
            return F.layer_norm(x, shape, weight, bias, self.eps).to(
                x.dtype
            )  # (CPU's kernel takes fp32 gamma, beta)
        h = torch.float32 if x.dtype in HALF else x.dtype  # the core module's compute dtype
        return F.layer_norm(x.to(h), shape, weight.to(h), bias.to(h), self.eps).to(x.dtype)
