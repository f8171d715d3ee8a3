"""Text classifier: our encoder, pooled to one vector, then a linear layer to class logits.

    logits = W · dropout(pool(Encoder(tokens))) + b        (B, C), C = number of classes

Pooling is the [CLS] vector or the mean over real (non-padding) tokens. The labels come from the
data, never from the input tokens, and the head has ``num_classes`` outputs, not V.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchformer.models.contextual import ContextualEncoder, EncoderConfig
from scratchformer.models.pooling import POOLING_MODES, pool

__all__ = ["ClassifierConfig", "TextClassifier"]


@dataclass
class ClassifierConfig:
    encoder: EncoderConfig  # the encoder's configuration
    num_classes: int = 2  # C, the number of classes (>= 2)
    pooling: str = "mean"  # "mean" over the real tokens or "cls" (the first position's vector)
    head_dropout: float = 0.1  # dropout on the pooled vector, before the class head

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling: expected one of {POOLING_MODES}, got {self.pooling!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder.to_dict(),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "head_dropout": self.head_dropout,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassifierConfig:
        unknown = sorted(set(data) - {"encoder", "num_classes", "pooling", "head_dropout"})
        if unknown:
            raise ValueError(f"ClassifierConfig: unknown fields {unknown}")
        return cls(**data)


class TextClassifier(nn.Module):
    """tokens (B, L) -> class logits (B, C)."""

    def __init__(self, config: ClassifierConfig):
        super().__init__()
        self.config = config
        self.encoder = ContextualEncoder(config.encoder)
        self.dropout = nn.Dropout(config.head_dropout)
        self.head = nn.Linear(config.encoder.d_model, config.num_classes)

    @classmethod
    def from_pretrained_encoder(
        cls,
        directory: str | Path,
        num_classes: int,
        pooling: str = "mean",
        head_dropout: float = 0.1,
        dropout: float | None = None,
        attention_dropout: float | None = None,
    ) -> TextClassifier:
        """Start from a pretrained BERT-family checkpoint directory (see scratchformer.models.pretrained).
        ``dropout``, ``attention_dropout``: replace the checkpoint's (as ``hidden_dropout_prob`` and
        ``attention_probs_dropout_prob`` given to ``from_pretrained`` do); None keeps them."""
        from scratchformer.models.pretrained import load_bert_encoder

        encoder = load_bert_encoder(directory)
        changes = {
            k: v for k, v in (("dropout", dropout), ("attention_dropout", attention_dropout)) if v is not None
        }
        model = cls(ClassifierConfig(replace(encoder.config, **changes), num_classes, pooling, head_dropout))
        model.encoder.load_state_dict(encoder.state_dict())
        return model

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(
        self, tokens: Tensor, padding_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """tokens (B, L); padding_mask (B, L) bool, True at real tokens (default ``!= pad_id``) -> (B, C)."""
        if padding_mask is None:
            pad_id = self.config.encoder.pad_id
            padding_mask = (
                tokens != pad_id if pad_id is not None else tokens.new_ones(tokens.shape, dtype=torch.bool)
            )
        hidden = self.encoder(tokens, padding_mask, token_type_ids)
        return self.head(self.dropout(pool(hidden, padding_mask, self.config.pooling)))
