"""Embeddings and positions (paper, sections 3.4 and 3.5).

"In the embedding layers, we multiply those weights by sqrt(d_model)." Positions are added::

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

even dimensions carry the sine and odd ones the cosine of the same angle (``layout="interleaved"``,
the paper's formula); ``"halves"`` puts all sines first, then all cosines (tensor2tensor, fairseq,
Marian). Learned positions (BERT) are the paper's table 3 row E.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_features, check_tokens

__all__ = ["LearnedPositionalEmbedding", "SinusoidalPositionalEncoding", "TokenEmbedding", "sinusoidal_table"]


class TokenEmbedding(nn.Module):
    """A D-dimensional vector for each of V token ids, times sqrt(D) (``scale``; BERT has none).
    ``padding_idx``: its vector starts at zero and gets no gradient from the lookup (a tied output
    projection still updates it)."""

    def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None, scale: bool = True):
        super().__init__()
        self.vocab_size, self.d_model, self.padding_idx = vocab_size, d_model, padding_idx
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Scaled (paper): N(0, D^-1/2), unit variance after the sqrt(D) scaling, so a tied output
        projection starts with logits of unit scale (as fairseq). Unscaled (BERT): N(0, 0.02)."""
        nn.init.normal_(self.weight, mean=0.0, std=self.d_model**-0.5 if self.scale != 1.0 else 0.02)
        if self.padding_idx is not None:
            nn.init.zeros_(self.weight[self.padding_idx])

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) integer ids -> (B, L, D)."""
        check_tokens("tokens", tokens, self.vocab_size)
        return nn.functional.embedding(tokens, self.weight, self.padding_idx) * self.scale


def sinusoidal_table(
    length: int, d_model: int, dtype: torch.dtype = torch.float32, layout: str = "interleaved"
) -> Tensor:
    """The ``(length, D)`` table of the paper's formula, computed in float64 then cast; ``layout``
    "interleaved" (sin, cos, sin, cos, ...) or "halves" (all sines, then all cosines)."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got d_model={d_model}")
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, D/2)
    if layout == "halves":
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(dtype)
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table.to(dtype)


def _rows(table: Tensor, offset: int | Tensor, length: int) -> Tensor:
    """table[offset : offset + length] (L, D); an ``offset`` (B,) per row: each row's own (B, L, D)."""
    if isinstance(offset, int):
        return table[offset : offset + length]
    return table[offset[:, None] + torch.arange(length, device=offset.device)]


def _end(offset: int | Tensor, length: int) -> int:
    """One past the last position asked for."""
    return (offset if isinstance(offset, int) else int(offset.max())) + length


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table (max_len x D, D even) to its input. A formula, not a weight:
    checkpoints do not store it. Past its length it computes a longer table, never an index error."""

    table: Tensor

    def __init__(self, d_model: int, max_len: int = 1024, layout: str = "interleaved"):
        super().__init__()
        self.d_model, self.layout = d_model, layout
        self.register_buffer("table", sinusoidal_table(max_len, d_model, layout=layout), persistent=False)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """x (B, L, D) -> x + PE[offset : offset + L], same shape and dtype; ``offset`` (B,): each
        row from its own position (rows that joined a running batch: continuous batching)."""
        check_features("x", x, "(B, L, D)", self.d_model)
        end = _end(offset, x.shape[1])
        if end > self.table.shape[0]:
            longer = sinusoidal_table(max(end, 2 * self.table.shape[0]), self.d_model, layout=self.layout)
            self.table = longer.to(self.table.device)
        return x + _rows(self.table, offset, x.shape[1]).to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained D-vector for each of ``max_len`` positions (BERT, GPT); longer input is a
    ``ValueError``, never an index crash."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """x (B, L, D) -> x + P[offset : offset + L]; ``offset`` (B,): each row from its own."""
        check_features("x", x, "(B, L, D)", self.weight.shape[1])
        end = _end(offset, x.shape[1])
        if end > self.max_len:
            raise ValueError(
                f"LearnedPositionalEmbedding: positions up to {end} requested, but the table has "
                f"max_len={self.max_len} positions"
            )
        return x + _rows(self.weight, offset, x.shape[1]).to(x.dtype)
