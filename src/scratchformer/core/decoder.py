"""Decoder (paper, section 3.1): N identical layers with three sub-layers, masked multi-head
self-attention, multi-head attention over the encoder output ("memory"), and a position-wise
feed-forward network. "We also modify the self-attention sub-layer in the decoder stack to prevent
positions from attending to subsequent positions": the causal mask (``causal=True``).

Incremental decoding passes a cache (:class:`scratchformer.generation.DecoderCache`): each step
feeds only the new tokens, reusing earlier self-attention keys/values and the memory's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.checks import check_features
from scratchformer.core.encoder import residual
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.core.masks import expand_attention_mask, fold_causal

__all__ = ["Decoder", "DecoderLayer"]


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over memory, feed-forward; each with dropout, a
    residual and a LayerNorm (:func:`~scratchformer.core.encoder.residual`, as the encoder's).
    Arguments as :class:`~scratchformer.core.encoder.EncoderLayer`."""

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
        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model, eps=layer_norm_eps) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

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
        cache: Any = None,
    ) -> Tensor:
        """x (B, T, D) target states (with a ``cache``, the new positions only), memory (B, S, D) (None
        once the cache holds its keys/values) -> (B, T, D). Masks, True = may attend: key-padding
        (B, T_total) and (B, S); tgt_mask (T, T_total), (B, T, T_total) or (B, H, T, T_total),
        memory_mask likewise over S. ``causal`` adds the no-peek mask; ``cache`` is updated in place."""
        if memory is None and (cache is None or cache.cross_attn.k is None):
            raise ValueError(
                "memory: expected the encoder output (B, S, D), got None (and no cached keys/values)"
            )
        self_masks = dict(
            key_padding_mask=tgt_key_padding_mask,
            attn_mask=tgt_mask,
            is_causal=causal,
            cache=None if cache is None else cache.self_attn,
        )
        cross_masks = dict(
            key_padding_mask=memory_key_padding_mask,
            attn_mask=memory_mask,
            cache=None if cache is None else cache.cross_attn,
        )

        def self_attention(y: Tensor) -> Tensor:
            return self.self_attn(y, **self_masks)[0]

        def cross_attention(y: Tensor) -> Tensor:  # queries from y, keys and values from the memory
            return self.cross_attn(y, memory, static_kv=True, **cross_masks)[0]

        x = residual(x, self_attention, self.norm1, self.dropout1, self.norm_first)
        x = residual(x, cross_attention, self.norm2, self.dropout2, self.norm_first)
        return residual(x, self.feed_forward, self.norm3, self.dropout3, self.norm_first)


class Decoder(nn.Module):
    """A stack of decoder layers, optionally followed by a LayerNorm (needed with pre-LN)."""

    def __init__(self, layers: Iterable[DecoderLayer], norm: LayerNorm | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

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
        cache: Any = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, S, D) -> (B, T, D); as ``DecoderLayer``, masks merged once here."""
        check_features("x", x, "(B, T, D)", None)
        B, T = x.shape[0], x.shape[1]
        heads = self.layers[0].self_attn.num_heads if len(self.layers) else 1
        total = T + (len(cache) if cache is not None else 0)  # self-attention keys, cached ones too
        self_mask = expand_attention_mask(tgt_key_padding_mask, tgt_mask, B, heads, T, total)
        self_mask, causal = fold_causal(self_mask, causal, T, total, x.device)
        if memory is not None:  # (else the cache holds the memory's keys; the layers check against those)
            memory_mask = expand_attention_mask(
                memory_key_padding_mask, memory_mask, B, heads, T, memory.shape[1]
            )
            memory_key_padding_mask = None
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                tgt_mask=self_mask,
                causal=causal,
                memory_key_padding_mask=memory_key_padding_mask,
                memory_mask=memory_mask,
                cache=cache.layers[i] if cache is not None else None,
            )
        return self.norm(x) if self.norm is not None else x
