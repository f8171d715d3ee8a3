"""The encoder-decoder Transformer (paper, section 3 and figure 1).

    logits = Generator(Decoder(Embed(tgt), Encoder(Embed(src))))

Logits (B, T, V), no softmax: that belongs to the loss or the decoding algorithm.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

from torch import Tensor, nn

from scratchformer.core.checks import check_features, check_mask, check_tokens
from scratchformer.core.config import ModelConfig
from scratchformer.core.masks import padding_mask

__all__ = ["Transformer", "TransformerConfig"]


@dataclass
class TransformerConfig(ModelConfig):
    """:class:`ModelConfig`'s fields and the encoder-decoder's own (each described by its comment)."""

    VOCABS = ("src_vocab_size", "tgt_vocab_size")
    SIZES = ("num_decoder_layers",)
    DEPTHS = ("num_encoder_layers",)

    src_vocab_size: int  # V of the source side
    tgt_vocab_size: int  # V of the target side
    _: KW_ONLY
    num_encoder_layers: int = 6  # N of the encoder stack (>= 0)
    num_decoder_layers: int = 6  # N of the decoder stack (>= 1: only its layers read the source)
    share_embeddings: bool = False  # one embedding matrix for both sides (needs equal V)
    tie_output: bool = False  # the output projection reuses the target embedding matrix (3.4)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )


class Transformer(nn.Module):
    """Encoder-decoder Transformer returning next-token logits.

    Example:
        >>> cfg = TransformerConfig(100, 100, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2)
        >>> logits = Transformer(cfg)(src, tgt)  # src (B, S), tgt (B, T) -> (B, T, V)
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = c = config
        self.src_embed = c.build_embedding(c.src_vocab_size)
        self.tgt_embed = self.src_embed if c.share_embeddings else c.build_embedding(c.tgt_vocab_size)
        self.src_pos, self.tgt_pos = c.build_positions(), c.build_positions()
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = c.build_encoder(c.num_encoder_layers)
        self.decoder = c.build_decoder(c.num_decoder_layers)
        self.generator = c.build_output(c.tgt_vocab_size, self.tgt_embed if c.tie_output else None)

    def num_parameters(self) -> int:  # trainable, shared matrices counted once
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def source_padding_mask(self, src: Tensor) -> Tensor | None:
        """(B, S) bool, True at real source tokens; None if the config has no pad_id."""
        return None if self.config.pad_id is None else padding_mask(src, self.config.pad_id)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """src (B, S) token ids -> memory (B, S, D); ``src_padding_mask`` (B, S) defaults to src != pad_id."""
        check_tokens("src", src, self.config.src_vocab_size, self.config.max_len)
        if src_padding_mask is not None:
            check_mask("src_padding_mask", src_padding_mask, [tuple(src.shape)], ["(B, L)"])
        else:
            src_padding_mask = self.source_padding_mask(src)
        return self.encoder(
            self.dropout(self.src_pos(self.src_embed(src))), key_padding_mask=src_padding_mask
        )

    def embed_target(self, tgt: Tensor, offset: int | Tensor = 0) -> Tensor:
        """tgt (B, T) ids at positions offset, offset + 1, ... (``offset`` (B,): per row) -> (B, T, D):
        embedding plus positions."""
        return self.tgt_pos(self.tgt_embed(tgt), offset=offset)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        cache: Any = None,
    ) -> Tensor:
        """Next-token logits (B, T, V_tgt) for the target prefix ``tgt`` (B, T) (with a ``cache``, the
        new tokens only; it is updated in place) given ``memory`` (B, S, D) from :meth:`encode`.
        ``src_padding_mask`` (B, S), True at real tokens. ``tgt_padding_mask`` (B, T) is not needed
        for right-padded targets: the causal mask already hides later (padding) positions."""
        offset = len(cache) if cache is not None else 0
        check_tokens("tgt", tgt, self.config.tgt_vocab_size)
        if offset + tgt.shape[1] > self.config.max_len:
            raise ValueError(
                f"tgt: sequence length {offset + tgt.shape[1]} exceeds the configured maximum "
                f"max_len={self.config.max_len}"
            )
        check_features("memory", memory, "(B, S, D)", self.config.d_model, batch=tgt.shape[0])
        if src_padding_mask is not None:
            check_mask("src_padding_mask", src_padding_mask, [tuple(memory.shape[:2])], ["(B, S)"])
        if tgt_padding_mask is not None:
            check_mask("tgt_padding_mask", tgt_padding_mask, [tuple(tgt.shape)], ["(B, L)"])
            if cache is not None:
                raise ValueError("tgt_padding_mask is not supported with a cache (incremental decoding)")
        x = self.dropout(self.embed_target(tgt, offset))
        masks = dict(tgt_key_padding_mask=tgt_padding_mask, memory_key_padding_mask=src_padding_mask)
        return self.generator(self.decoder(x, memory, **masks, cache=cache))

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher forcing: src (B, S), tgt (B, T) token ids -> (B, T, V_tgt) logits; masks as in
        :meth:`encode` and :meth:`decode`. The decoder's self-attention is always causal."""
        memory = self.encode(src, src_padding_mask)
        src_padding_mask = self.source_padding_mask(src) if src_padding_mask is None else src_padding_mask
        return self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)
