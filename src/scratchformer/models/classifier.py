"""Text classifier: our encoder, pooled to one vector, then a linear layer to class logits.

    logits = W · dropout(pool(Encoder(tokens))) + b        (B, C), C = number of classes

Pooling is the mean over real (non-padding) tokens, the [CLS] vector, or BERT's pooler on it,
tanh(W_p h_[CLS] + b_p): that last one is ``BertForSequenceClassification``'s, so such a classifier
goes in and out of Hugging Face's format (:mod:`scratchformer.formats.hf_classifier`). The labels
come from the data, never from the input tokens, and the head has ``num_classes`` outputs, not V.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchformer.core.keys import reject_unknown
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig
from scratchformer.models.pooling import POOLING_MODES, pool

__all__ = ["POOLINGS", "ClassifierConfig", "TextClassifier"]

POOLINGS = (*POOLING_MODES, "pooler")  # "pooler": BERT's tanh(W_p h_[CLS] + b_p)


@dataclass
class ClassifierConfig:
    encoder: EncoderConfig  # the encoder's configuration
    num_classes: int = 2  # C, the number of classes (>= 2)
    pooling: str = "mean"  # "mean" over the real tokens, "cls" (the first position's vector) or "pooler"
    # (BERT's tanh(W h_[CLS] + b), BertForSequenceClassification's; it sets encoder.pooler)
    head_dropout: float = 0.1  # dropout on the pooled vector, before the class head

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, got {self.pooling!r}")
        if self.pooling == "pooler" and not self.encoder.pooler:  # the pooler is the encoder's (BERT's)
            self.encoder = replace(self.encoder, pooler=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder.to_dict(),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "head_dropout": self.head_dropout,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassifierConfig:
        reject_unknown(data, [f.name for f in fields(cls)], cls.__name__)
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
    def from_encoder(
        cls,
        encoder: ContextualEncoder,
        num_classes: int,
        pooling: str = "mean",
        head_dropout: float = 0.1,
        dropout: float | None = None,
        attention_dropout: float | None = None,
    ) -> TextClassifier:
        """A new class head on a (pretrained) encoder, whose weights are copied.
        ``dropout``, ``attention_dropout``: replace the encoder's (as ``hidden_dropout_prob`` and
        ``attention_probs_dropout_prob`` given to ``from_pretrained`` do); None keeps them. Pooling
        "pooler" uses the encoder's pooler; one without (DistilBERT, some sentence-transformers
        models) gets a new one, initialised as any new linear layer and trained with the head, as
        ``BertForSequenceClassification.from_pretrained`` does. From a checkpoint directory:
        :func:`scratchformer.formats.hf_classifier.classifier_from_pretrained`."""
        changes = {
            k: v for k, v in (("dropout", dropout), ("attention_dropout", attention_dropout)) if v is not None
        }
        model = cls(ClassifierConfig(replace(encoder.config, **changes), num_classes, pooling, head_dropout))
        state = encoder.state_dict()
        if model.encoder.pooler is not None and encoder.pooler is None:  # a new pooler: its own init
            state |= {f"pooler.{k}": v for k, v in model.encoder.pooler.state_dict().items()}
        model.encoder.load_state_dict(state)
        return model

    @classmethod
    def from_pretrained_encoder(cls, directory: str | Path, *args: Any, **kwargs: Any) -> TextClassifier:
        """Deprecated in 0.11, gone in 0.12: use
        :func:`scratchformer.formats.hf_classifier.classifier_from_pretrained`."""
        warnings.warn(
            "TextClassifier.from_pretrained_encoder is deprecated and goes in 0.12: use "
            "scratchformer.formats.hf_classifier.classifier_from_pretrained",
            DeprecationWarning,
            stacklevel=2,
        )
        from scratchformer.formats.hf_classifier import classifier_from_pretrained  # the deprecated path

        return classifier_from_pretrained(directory, *args, **kwargs)

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
        hidden = self.encoder(tokens, padding_mask, token_type_ids)  # (B, L, D)
        if self.config.pooling == "pooler":
            pooled = self.encoder.pool(hidden)  # tanh(W_p h_[CLS] + b_p), (B, D)
        else:
            pooled = pool(hidden, padding_mask, self.config.pooling)
        return self.head(self.dropout(pooled))


_MOVED = ("hf_classifier_export", "is_classifier_export", "load_classifier_export")  # 0.11; gone in 0.12


def __getattr__(name: str) -> Any:
    """The names that moved to :mod:`scratchformer.formats.hf_classifier` in 0.11, with a warning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"scratchformer.models.classifier.{name} moved to scratchformer.formats.hf_classifier.{name}; "
        "the old path goes in 0.12",
        DeprecationWarning,
        stacklevel=2,
    )
    import scratchformer.formats.hf_classifier as hf_classifier  # the deprecated path

    return getattr(hf_classifier, name)
