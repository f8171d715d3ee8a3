"""Encoder (paper, section 3.1): N identical layers, each with two sub-layers, multi-head
self-attention and a position-wise feed-forward network.

"We employ a residual connection around each of the two sub-layers, followed by layer
normalization. That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))" (post-LN).
``norm_first=True`` gives x + Sublayer(LayerNorm(x)) (pre-LN, Xiong et al. 2020), which trains
without warm-up tricks; the stack then ends with a LayerNorm. :func:`residual` is that connection,
written once: the decoder's layers wrap their three sub-layers in it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import Tensor, nn

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.checks import check_features
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.core.masks import expand_attention_mask

__all__ = ["Encoder", "EncoderLayer", "residual"]


def residual(
    x: Tensor, sublayer: Callable[[Tensor], Tensor], norm: nn.Module, dropout: nn.Module, norm_first: bool
) -> Tensor:
    """A sub-layer with its residual connection: LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the
    paper), or with ``norm_first`` x + Dropout(Sublayer(LayerNorm(x))) (pre-LN)."""
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped in dropout, a residual and a LayerNorm.
    Arguments as :class:`~scratchformer.core.config.ModelConfig`'s fields (D, H, d_ff, ...);
    ``attention_dropout`` 0 lets the fused attention kernel run, much faster on CPU."""

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
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout, activation, bias=bias)
        self.norm1, self.norm2 = (
            LayerNorm(d_model, eps=layer_norm_eps),
            LayerNorm(d_model, eps=layer_norm_eps),
        )
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        """x (B, S, D) -> (B, S, D); key_padding_mask (B, S) bool, True at real tokens; attn_mask
        (S, S), (B, S, S) or (B, H, S, S) bool, True = may attend."""

        def self_attention(y: Tensor) -> Tensor:
            return self.self_attn(y, key_padding_mask=key_padding_mask, attn_mask=attn_mask)[0]

        x = residual(x, self_attention, self.norm1, self.dropout1, self.norm_first)
        return residual(x, self.feed_forward, self.norm2, self.dropout2, self.norm_first)


class Encoder(nn.Module):
    """N encoder layers applied in order, then an optional LayerNorm (needed with pre-LN)."""

    def __init__(self, layers: Iterable[EncoderLayer], norm: LayerNorm | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """x (B, S, D) -> (B, S, D); masks as in ``EncoderLayer``, merged once here. With
        ``output_hidden_states`` also the N + 1 hidden states: the input, then every layer's output
        (the last one before the final norm, as Hugging Face does)."""
        check_features("x", x, "(B, S, D)", None)
        heads = self.layers[0].self_attn.num_heads if len(self.layers) else 1
        mask = expand_attention_mask(key_padding_mask, attn_mask, x.shape[0], heads, x.shape[1], x.shape[1])
        hidden = [x]
        for layer in self.layers:
            x = layer(x, attn_mask=mask)
            hidden.append(x)
        x = x if self.norm is None else self.norm(x)
        return (x, hidden) if output_hidden_states else x
