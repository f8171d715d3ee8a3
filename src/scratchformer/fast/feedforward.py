"""The feed-forward network with ReLU applied in place: the same values as
:class:`scratchformer.core.feedforward.PositionwiseFeedForward`, one (B, L, d_ff) tensor fewer."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.checks import check_features
from scratchformer.core.feedforward import ACTIVATIONS, PositionwiseFeedForward

__all__ = ["FastFeedForward"]


class FastFeedForward(PositionwiseFeedForward):
    """ReLU in place on the fresh linear output (autograd-safe: the matmul does not keep its output
    for backward), which saves allocating and writing a second (B, L, d_ff) tensor."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        check_features("x", x, "(B, L, D)", self.linear1.in_features, dims=None)
        h = self.linear1(x)
        h = F.relu(h, inplace=True) if self.activation == "relu" else ACTIVATIONS[self.activation](h)
        return self.linear2(self.dropout(h) if self.dropout.training and self.dropout.p > 0 else h)
