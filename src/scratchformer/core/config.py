"""One base for the model configurations, and the one builder of what every model is made of:
stacks of layers, positions and the (tied) output projection. ``TransformerConfig``,
``EncoderConfig`` and ``CaptioningConfig`` add their own fields to :class:`ModelConfig`'s; a shared
field is declared once, so no model can drift from the others."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar, TypeVar

from torch import nn

from scratchformer.core.decoder import Decoder, DecoderLayer
from scratchformer.core.embedding import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
)
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.core.keys import reject_unknown
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["ModelConfig"]

C = TypeVar("C", bound="ModelConfig")
# The most layers a stack may have: the deepest Transformer trained, DeepNet (Wang et al., 2022),
# has 1,000 in all. A config.json edited to 10^5 layers is refused here, not built for minutes.
MAX_LAYERS = 1000


@dataclass
class ModelConfig:
    """The shared fields (keyword-only), each described by its comment; the defaults are the
    paper's base model."""

    VOCABS: ClassVar[tuple[str, ...]] = ()  # vocabulary sizes of the subclass (pad_id must fit them)
    SIZES: ClassVar[tuple[str, ...]] = ()  # its other sizes that must be positive
    DEPTHS: ClassVar[tuple[str, ...]] = ()  # its layer counts (>= 0)

    _: KW_ONLY
    d_model: int = 512  # D, the width of every token vector (a multiple of num_heads)
    num_heads: int = 8  # H, attention heads, each of width d_k = D / H
    d_ff: int = 2048  # the feed-forward layer's inner width
    dropout: float = 0.1  # P_drop, everywhere (embeddings, sublayer outputs, feed-forward), in [0, 1)
    attention_dropout: float | None = None  # on the attention probabilities, in [0, 1) (None: dropout)
    activation: str = "relu"  # "relu" (paper), "gelu" (BERT) or "silu" (Marian's "swish")
    norm_first: bool = False  # False: post-LN (paper); True: pre-LN
    final_norm: bool | None = None  # a LayerNorm after each stack (None: if norm_first and it has layers)
    layer_norm_eps: float = 1e-5  # the LayerNorms' epsilon (> 0)
    bias: bool = True  # biases in the linear maps
    max_len: int = 1024  # longest sequence accepted, in tokens (the positions' table)
    positional: str = "sinusoidal"  # "sinusoidal" (paper) or "learned"
    sinusoidal_layout: str = "interleaved"  # "interleaved" (paper) or "halves" (Marian)
    scale_embedding: bool = True  # token vectors times sqrt(D) (paper; BERT does not)
    output_bias: bool | None = None  # a bias on the output projection (None: only if untied;
    # Marian's final_logits_bias)
    pad_id: int | None = 0  # the padding id (None: no padding)

    def __post_init__(self) -> None:
        for name in (*self.VOCABS, "d_model", "num_heads", "d_ff", "max_len", *self.SIZES, *self.DEPTHS):
            value, least = getattr(self, name), 0 if name in self.DEPTHS else 1
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(
                    f"{name} must be {'>= 0' if least == 0 else 'positive'} (an integer), got {value!r}"
                )
            if name.endswith("layers") and value > MAX_LAYERS:
                raise ValueError(f"{name} must be at most {MAX_LAYERS:,} (a layer count), got {value:,}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads} (d_k = D / H)"
            )
        for name, choices in (
            ("positional", ("sinusoidal", "learned")),
            ("activation", ("relu", "gelu", "silu")),
            ("sinusoidal_layout", ("interleaved", "halves")),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: expected one of {choices}, got {getattr(self, name)!r}")
        for name in ("dropout", "attention_dropout"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        vocab = min(getattr(self, name) for name in self.VOCABS) if self.VOCABS else None
        if self.pad_id is not None and vocab is not None and not 0 <= self.pad_id < vocab:
            raise ValueError(f"pad_id={self.pad_id} is outside the vocabulary [0, {vocab})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """From ``to_dict``'s output (a checkpoint's config.json); an unknown field is an error."""
        reject_unknown(data, [f.name for f in dataclasses.fields(cls)], cls.__name__)
        return cls(**data)

    def build_embedding(self, vocab_size: int) -> TokenEmbedding:
        """V token vectors of width D (times sqrt(D) if ``scale_embedding``); the pad row starts at 0."""
        return TokenEmbedding(vocab_size, self.d_model, padding_idx=self.pad_id, scale=self.scale_embedding)

    def build_positions(self) -> nn.Module:
        """Sinusoidal positions (section 3.5) or a learned table."""
        if self.positional == "learned":
            return LearnedPositionalEmbedding(self.max_len, self.d_model)
        return SinusoidalPositionalEncoding(self.d_model, self.max_len, self.sinusoidal_layout)

    def has_final_norm(self, num_layers: int) -> bool:
        """Whether a stack of ``num_layers`` layers ends with a LayerNorm (``final_norm``; None: if
        pre-LN)."""
        return self.norm_first and num_layers > 0 if self.final_norm is None else self.final_norm

    def _final_norm(self, num_layers: int) -> LayerNorm | None:
        return LayerNorm(self.d_model, self.layer_norm_eps) if self.has_final_norm(num_layers) else None

    def _layer_args(self) -> tuple[Any, ...]:
        return (
            self.d_model,
            self.num_heads,
            self.d_ff,
            self.dropout,
            self.activation,
            self.norm_first,
            self.layer_norm_eps,
            self.bias,
            self.attention_dropout,
        )

    def build_encoder(self, num_layers: int) -> Encoder:
        """N encoder layers and, if wanted, the final LayerNorm."""
        return Encoder(
            [EncoderLayer(*self._layer_args()) for _ in range(num_layers)], self._final_norm(num_layers)
        )

    def build_decoder(self, num_layers: int) -> Decoder:
        """N decoder layers and, if wanted, the final LayerNorm."""
        return Decoder(
            [DecoderLayer(*self._layer_args()) for _ in range(num_layers)], self._final_norm(num_layers)
        )

    def build_output(self, vocab_size: int, tied_to: TokenEmbedding | None = None) -> nn.Linear:
        """The pre-softmax projection D -> V; ``tied_to``: share that embedding's matrix (section 3.4)."""
        bias = tied_to is None if self.output_bias is None else self.output_bias
        generator = nn.Linear(self.d_model, vocab_size, bias=bias)
        if tied_to is not None:
            generator.weight = tied_to.weight
            if generator.bias is not None:
                nn.init.zeros_(generator.bias)
        else:
            nn.init.xavier_uniform_(generator.weight)
        return generator
