"""Position-wise feed-forward network (paper, section 3.3), applied to every position separately:

FFN(x) = max(0, x W1 + b1) W2 + b2        (D -> d_ff -> D; ReLU as the paper, or GELU as BERT)
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.core.checks import check_features

__all__ = ["PositionwiseFeedForward"]

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
}  # gelu: exact (erf), as BERT; silu = swish (Marian)


class PositionwiseFeedForward(nn.Module):
    """D -> d_ff (2048 in the paper for D = 512) -> D, with the activation and dropout between."""

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "relu", bias: bool = True
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # W1, b1
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # W2, b2
        self.dropout = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.linear1.weight)  # as torch.nn.Transformer; biases keep nn.Linear's init
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, D) -> (B, L, D); any leading shape (..., D) works."""
        check_features("x", x, "(B, L, D)", self.linear1.in_features, dims=None)
        return self.linear2(self.dropout(ACTIVATIONS[self.activation](self.linear1(x))))
