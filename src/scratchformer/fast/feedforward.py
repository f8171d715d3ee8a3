"""The feed-forward network with ReLU applied in place: the same values as
:class:`scratchformer.core.feedforward.PositionwiseFeedForward`, one (B, L, d_ff) tensor fewer."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.checks import check_features
from scratchformer.core.feedforward import ACTIVATIONS, PositionwiseFeedForward

__all__ = ["FastFeedForward", "dropout"]


def dropout(module: nn.Dropout, x: Tensor) -> Tensor:
    """``module(x)``, without the module call when it is the identity (eval, or p = 0)."""
    return module(x) if module.training and module.p > 0 else x


class FastFeedForward(PositionwiseFeedForward):
    """ReLU in place on the fresh linear output (autograd-safe: the matmul does not keep its output
    for backward), which saves allocating and writing a second (B, L, d_ff) tensor."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        check_features("x", x, "(B, L, D)", self.linear1.in_features, dims=None)
        h = self.linear1(x)
        h = F.relu(h, inplace=True) if self.activation == "relu" else ACTIVATIONS[self.activation](h)
        return self.linear2(dropout(self.dropout, h))
