"""Decoder (paper, section 3.1): N identical layers with three sub-layers, masked multi-head
self-attention, multi-head attention over the encoder output ("memory"), and a position-wise
feed-forward network.

"We also modify the self-attention sub-layer in the decoder stack to prevent positions from
attending to subsequent positions." The causal mask is on by default (``causal=True``).

Incremental decoding keeps a :class:`DecoderCache`: each step feeds only the new tokens, the
self-attention keys/values of earlier positions are reused, and the memory's cross-attention
keys/values are computed once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from torch import Tensor, nn

from scratchformer.core.attention import KVCache, MultiHeadAttention
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm

__all__ = ["Decoder", "DecoderCache", "DecoderLayer", "DecoderLayerCache"]


@dataclass
class DecoderLayerCache:
    """Keys/values of one decoder layer: growing self-attention, fixed cross-attention."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)


class DecoderCache:
    """Incremental-decoding state of a whole decoder stack (one entry per layer)."""

    def __init__(self, num_layers: int):
        self.layers = [DecoderLayerCache() for _ in range(num_layers)]

    def __len__(self) -> int:
        """Number of target positions already decoded."""
        return len(self.layers[0].self_attn) if self.layers else 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) in that order, e.g. the surviving beams."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over memory, feed-forward; each with dropout,
    residual and LayerNorm (post-LN by default, pre-LN with ``norm_first``). Arguments as
    ``EncoderLayer``."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        attention_dropout: float | None = None,
    ):
        super().__init__()
        self.norm_first = norm_first
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=attention_dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=attention_dropout, bias=bias)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation, bias=bias)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        causal: bool = True,
        cache: DecoderLayerCache | None = None,
    ) -> Tensor:
        """Decode one layer.

        Args:
            x: (B, T, D) target-side states (only the new positions when ``cache`` is given).
            memory: (B, S, D) encoder output (may be None once ``cache`` holds its keys/values).
            tgt_key_padding_mask: (B, T_total) bool, True at real target tokens.
            memory_key_padding_mask: (B, S) bool, True at real source tokens.
            tgt_mask: (T, T_total), (B, T, T_total) or (B, H, T, T_total) bool self-attention mask.
            memory_mask: (T, S), (B, T, S) or (B, H, T, S) bool cross-attention mask.
            causal: apply the no-peek mask in self-attention (on top of ``tgt_mask``).
            cache: this layer's incremental state, updated in place.

        Returns:
            (B, T, D).
        """
        self_cache = cache.self_attn if cache is not None else None
        cross_cache = cache.cross_attn if cache is not None else None
        if memory is None and (cross_cache is None or cross_cache.k is None):
            raise ValueError("memory: expected the encoder output (B, S, D), got None (and no cached keys/values)")

        def self_attention(h: Tensor) -> Tensor:
            out, _ = self.self_attn(
                h, key_padding_mask=tgt_key_padding_mask, attn_mask=tgt_mask, is_causal=causal, cache=self_cache
            )
            return self.dropout1(out)

        def cross_attention(h: Tensor) -> Tensor:
            out, _ = self.cross_attn(
                h,
                memory,
                key_padding_mask=memory_key_padding_mask,
                attn_mask=memory_mask,
                cache=cross_cache,
                static_kv=True,
            )
            return self.dropout2(out)

        if self.norm_first:
            x = x + self_attention(self.norm1(x))
            x = x + cross_attention(self.norm2(x))
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            x = self.norm1(x + self_attention(x))
            x = self.norm2(x + cross_attention(x))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x


class Decoder(nn.Module):
    """A stack of decoder layers, optionally followed by a LayerNorm (needed with pre-LN)."""

    def __init__(self, layers: Iterable[DecoderLayer], norm: LayerNorm | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def new_cache(self) -> DecoderCache:
        """An empty incremental-decoding state for this stack."""
        return DecoderCache(len(self.layers))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        causal: bool = True,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, S, D) -> (B, T, D); arguments as in ``DecoderLayer``."""
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                causal=causal,
                cache=cache.layers[i] if cache is not None else None,
            )
        return self.norm(x) if self.norm is not None else x
