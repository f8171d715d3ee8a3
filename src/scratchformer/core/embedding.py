"""Token embedding (paper, section 3.4).

"In the embedding layers, we multiply those weights by sqrt(d_model)."
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_tokens

__all__ = ["TokenEmbedding"]


class TokenEmbedding(nn.Module):
    """Look up a D-dimensional vector for each token id, times sqrt(D).

    Args:
        vocab_size: V, the number of token ids.
        d_model: D, the model width.
        padding_idx: id whose vector starts at zero and gets no gradient from the lookup
            (a tied output projection still updates it).
        scale: multiply by sqrt(D) as in the paper (BERT-style models set False).
    """

    def __init__(self, vocab_size: int, d_model: int, padding_idx: int | None = None, scale: bool = True):
        super().__init__()
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.padding_idx = padding_idx
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Scaled (paper): N(0, D^-1/2), so that after the sqrt(D) scaling the vectors have unit
        # variance and a tied output projection starts with logits of unit scale (as fairseq).
        # Unscaled (BERT): N(0, 0.02), BERT's initializer_range.
        nn.init.normal_(self.weight, mean=0.0, std=self.d_model**-0.5 if self.scale != 1.0 else 0.02)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) integer ids -> (B, L, D)."""
        check_tokens("tokens", tokens, self.vocab_size)
        out = nn.functional.embedding(tokens, self.weight, self.padding_idx)
        return out * self.scale if self.scale != 1.0 else out

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.d_model}, padding_idx={self.padding_idx}, scale={self.scale:.4g}"
