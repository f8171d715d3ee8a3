"""Position information (paper, section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Even dimensions carry the sine and odd dimensions the cosine of the same angle (interleaved, as in
the paper), not the two halves concatenated.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_features

__all__ = ["LearnedPositionalEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_table"]


def sinusoidal_table(length: int, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The ``(length, D)`` table of the paper's formula, computed in float64 then cast."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got d_model={d_model}")
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, D/2)
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.to(dtype)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to its input.

    The table is a non-persistent buffer (it is a formula, not a weight, so it is not saved in
    checkpoints). Asked for positions past its length, it recomputes a table long enough for them
    instead of crashing with an index error.

    Args:
        d_model: D, the model width (even).
        max_len: rows computed up front.
    """

    table: Tensor

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, L, D) -> x + PE[offset : offset + L], same shape and dtype."""
        check_features("x", x, "(B, L, D)", self.d_model)
        end = offset + x.shape[1]
        if end > self.table.shape[0]:
            self.table = sinusoidal_table(max(end, 2 * self.table.shape[0]), self.d_model).to(self.table.device)
        return x + self.table[offset:end].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per absolute position (BERT, GPT, and the paper's ablation in table 3 row E).

    Args:
        max_len: number of positions; a longer input is a ``ValueError``, never an index crash.
        d_model: D, the model width.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x (B, L, D) -> x + P[offset : offset + L]."""
        check_features("x", x, "(B, L, D)", self.weight.shape[1])
        end = offset + x.shape[1]
        if end > self.max_len:
            raise ValueError(
                f"LearnedPositionalEmbedding: positions up to {end} requested, but the table has "
                f"max_len={self.max_len} positions"
            )
        return x + self.weight[offset:end].to(x.dtype)
