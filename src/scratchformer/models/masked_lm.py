"""BERT's masked language model: our encoder, then the MLM head whose output matrix is the token
embedding itself (Devlin et al. 2019; the tying of Press and Wolf 2017, as section 3.4 of the paper)::

    h = LayerNorm(act(W_t x + b_t))          the head's transform, D -> D
    logits = h E^T + b                       E: the (V, D) token embedding, shared, not copied

Logits are computed only where they are asked for (the ~15% chosen positions), not over the whole
(B, L, V) grid: with V = 16k that projection would cost as much as the encoder.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scratchformer.core.feedforward import ACTIVATIONS
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig

__all__ = ["MaskedLMHead", "MaskedLanguageModel"]


class MaskedLMHead(nn.Module):
    """BERT's prediction head: (M, D) -> (M, V), its decoder tied to ``embedding`` (V, D)."""

    def __init__(self, config: EncoderConfig, embedding: nn.Parameter):
        super().__init__()
        self.activation = config.activation
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.norm = LayerNorm(config.d_model, config.layer_norm_eps)
        self.embedding = embedding  # the token embedding's parameter, registered here as the same object
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V)."""
        h = self.norm(ACTIVATIONS[self.activation](self.dense(hidden)))
        return nn.functional.linear(h, self.embedding, self.bias)


class MaskedLanguageModel(nn.Module):
    """tokens (B, L) -> the logits of the original tokens at the M chosen positions (M, V)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.encoder = ContextualEncoder(config)
        self.head = MaskedLMHead(config, self.encoder.embeddings.token.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)  # the tied matrix once

    def forward(
        self, tokens: Tensor, padding_mask: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """tokens (B, L); padding_mask (B, L) bool, True at real tokens; positions (B, L) bool, where
        to predict -> logits (M, V), M = positions.sum(), in row-major order (all B*L positions,
        as (B, L, V), if ``positions`` is None)."""
        hidden = self.encoder(tokens, padding_mask)  # (B, L, D)
        if positions is None:
            return self.head(hidden)
        if positions.shape != tokens.shape or positions.dtype != torch.bool:
            raise ValueError(
                f"positions: expected a bool tensor of the tokens' shape (B, L)={tuple(tokens.shape)}, "
                f"got {positions.dtype} {tuple(positions.shape)}"
            )
        return self.head(hidden[positions])  # (M, V)
