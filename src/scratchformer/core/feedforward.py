"""Position-wise feed-forward network (paper, section 3.3).

    FFN(x) = max(0, x W1 + b1) W2 + b2

applied to every position separately: D -> d_ff -> D, ReLU as in the paper or GELU as in BERT.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.checks import check_last_dim

__all__ = ["PositionwiseFeedForward"]

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class PositionwiseFeedForward(nn.Module):
    """Two linear maps with an activation (and dropout) between them.

    Args:
        d_model: D, input and output width.
        d_ff: inner width (2048 in the paper for D = 512).
        dropout: applied to the activations of the inner layer.
        activation: "relu" (paper) or "gelu" (exact erf GELU, as BERT).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "relu", bias: bool = True):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # W1, b1
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # W2, b2
        self.dropout = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.linear1.weight)  # as torch.nn.Transformer; biases keep nn.Linear's init
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, D) -> (B, L, D); also (N, D) packed tokens (see :mod:`scratchformer.fast.packing`)."""
        check_last_dim("x", x, self.linear1.in_features, "(B, L, D)")
        h = self.linear1(x)
        # ReLU in place on the fresh linear output (autograd-safe: the matmul does not keep its
        # output for backward) saves allocating and writing a second (B, L, d_ff) tensor.
        h = F.relu(h, inplace=True) if self.activation == "relu" else _ACTIVATIONS[self.activation](h)
        return self.linear2(self.dropout(h))
