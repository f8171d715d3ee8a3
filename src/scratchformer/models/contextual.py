"""A stand-alone contextual encoder: embeddings + the paper's encoder stack.

One vector per token, in context: the left half of figure 1 on its own. The same configuration
expresses the paper's encoder (scaled token embedding + sinusoidal positions) and the BERT
family (learned positions, token-type embeddings, a LayerNorm on the embeddings, exact GELU,
LayerNorm eps 1e-12, post-LN) without a second copy of the layer code: both use
:class:`~scratchformer.EncoderLayer`, built by :meth:`ModelConfig.build_encoder`.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import torch
from torch import Tensor, nn

from scratchformer.core.checks import check_mask, check_tokens
from scratchformer.core.config import ModelConfig
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["ContextualEncoder", "EncoderConfig", "EncoderEmbedding"]


@dataclass
class EncoderConfig(ModelConfig):
    """:class:`~scratchformer.core.config.ModelConfig`'s fields (with BERT-like defaults here), and:

    Attributes:
        vocab_size: V, the number of token ids.
        num_layers: N, encoder layers (>= 0).
        type_vocab_size: number of token types (segments); 0 = no token-type embedding.
        embedding_norm: LayerNorm on the summed embeddings (BERT).
        pooler: BERT's pooler, tanh(W h_[CLS] + b).
        positions_skip_padding: a token's position counts the real tokens before it, not the
            columns (RoBERTa, XLM-R), so left padding shifts nothing; needs positional "learned".
    """

    VOCABS = ("vocab_size",)
    DEPTHS = ("num_layers",)

    vocab_size: int
    _: KW_ONLY
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int = 1024
    activation: str = "gelu"
    max_len: int = 512
    positional: str = "learned"
    type_vocab_size: int = 0
    embedding_norm: bool = False
    pooler: bool = False
    positions_skip_padding: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positions_skip_padding and self.positional != "learned":
            raise ValueError("positions_skip_padding needs positional='learned' (RoBERTa's table)")


class EncoderEmbedding(nn.Module):
    """token (+ token type) + position, then an optional LayerNorm, then dropout: (B, L) -> (B, L, D)."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.token = c.build_embedding(c.vocab_size)
        self.position = c.build_positions()
        self.token_type = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        if self.token_type is not None:
            nn.init.normal_(self.token_type.weight, std=0.02)
        self.norm = LayerNorm(c.d_model, c.layer_norm_eps) if c.embedding_norm else None
        self.dropout = nn.Dropout(c.dropout)
        self.skip_padding = c.positions_skip_padding

    def forward(
        self, tokens: Tensor, token_type_ids: Tensor | None = None, padding_mask: Tensor | None = None
    ) -> Tensor:
        """tokens (B, L); token_type_ids (B, L) segment ids (default all 0); padding_mask (B, L), True
        at real tokens (read with ``positions_skip_padding`` only) -> (B, L, D)."""
        x = self.token(tokens)
        if self.token_type is not None:
            types = torch.zeros_like(tokens) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        if self.skip_padding and padding_mask is not None:  # RoBERTa: the real tokens before, counted
            x = x + self.position.weight[(padding_mask.long().cumsum(1) - 1).clamp(min=0)].to(x.dtype)
        else:
            x = self.position(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class ContextualEncoder(nn.Module):
    """Token ids -> contextual vectors (B, L, D), optionally with every layer's hidden states."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = c = config
        self.embeddings = EncoderEmbedding(c)
        self.encoder = c.build_encoder(c.num_layers)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(
        self,
        tokens: Tensor,
        padding_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Encode a padded batch.

        Args:
            tokens: (B, L) token ids.
            padding_mask: (B, L) bool, True at real tokens; defaults to ``tokens != pad_id``.
            token_type_ids: (B, L) segment ids in [0, type_vocab_size).
            output_hidden_states: also return the N + 1 hidden states (the embedding output,
                then each layer's output), as Hugging Face's ``output_hidden_states``.

        Returns:
            (B, L, D), and the list of hidden states if asked.
        """
        c = self.config
        check_tokens("tokens", tokens, c.vocab_size, c.max_len)
        if padding_mask is not None:
            check_mask("padding_mask", padding_mask, [tuple(tokens.shape)], ["(B, L)"])
        elif c.pad_id is not None:
            padding_mask = tokens != c.pad_id
        if token_type_ids is not None:
            if c.type_vocab_size == 0:
                raise ValueError("token_type_ids given, but the config has type_vocab_size=0")
            check_tokens("token_type_ids", token_type_ids, c.type_vocab_size)
            if token_type_ids.shape != tokens.shape:
                raise ValueError(
                    f"token_type_ids: expected the shape of tokens (B, L)={tuple(tokens.shape)}, "
                    f"got {tuple(token_type_ids.shape)}"
                )
        x = self.embeddings(tokens, token_type_ids, padding_mask)
        return self.encoder(x, key_padding_mask=padding_mask, output_hidden_states=output_hidden_states)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler on the first ([CLS]) position: (B, L, D) -> (B, D)."""
        if self.pooler is None:
            raise ValueError("this encoder has no pooler (EncoderConfig.pooler=False)")
        return torch.tanh(self.pooler(hidden[:, 0]))
