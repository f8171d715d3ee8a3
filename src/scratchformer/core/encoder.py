"""Encoder (paper, section 3.1): a stack of N identical layers, each with two sub-layers,
multi-head self-attention and a position-wise feed-forward network.

"We employ a residual connection around each of the two sub-layers, followed by layer
normalization. That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))" (post-LN).
With ``norm_first=True`` the norm moves inside the residual branch, x + Sublayer(LayerNorm(x))
(pre-LN, Xiong et al. 2020), which trains without warm-up tricks; the stack then ends with a
final LayerNorm.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.fast.packing import Packing

__all__ = ["Encoder", "EncoderLayer"]


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped in dropout, a residual and a LayerNorm.

    Args:
        d_model: D.  num_heads: H.  d_ff: feed-forward inner width.
        dropout: on each sub-layer's output, the attention probabilities and the FFN activations.
        activation: "relu" or "gelu".
        norm_first: False = post-LN (paper), True = pre-LN.
        layer_norm_eps: LayerNorm epsilon.
        bias: biases in the linear maps.
        attention_dropout: dropout on the attention probabilities; None = ``dropout`` (paper,
            torch.nn). 0 lets the fused attention kernel run and saves much time on CPU.
    """

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
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _self_attention(
        self, x: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None, packing: Packing | None
    ) -> Tensor:
        if packing is not None:
            return self.dropout1(self.self_attn.packed_self_attention(x, packing, attn_mask))
        out, _ = self.self_attn(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        return self.dropout1(out)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        *,
        packing: Packing | None = None,
    ) -> Tensor:
        """x (B, S, D); key_padding_mask (B, S) bool, True at real tokens; attn_mask (S, S),
        (B, S, S) or (B, H, S, S) bool, True = may attend. Returns (B, S, D).

        With ``packing`` x is (N, D), only the real tokens (see :mod:`scratchformer.fast.packing`);
        the padding mask is then the packing's and ``key_padding_mask`` is ignored.
        """
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), key_padding_mask, attn_mask, packing)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            x = self.norm1(x + self._self_attention(x, key_padding_mask, attn_mask, packing))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x


def _all_real(key_padding_mask: Tensor | None, x: Tensor) -> bool:
    """Whether a well-formed (B, S) bool padding mask marks every position real (reads it on the host)."""
    return (
        key_padding_mask is not None
        and key_padding_mask.dtype == torch.bool
        and tuple(key_padding_mask.shape) == tuple(x.shape[:2])
        and not torch.compiler.is_compiling()
        and bool(key_padding_mask.all())
    )


class Encoder(nn.Module):
    """A stack of encoder layers, optionally followed by a LayerNorm (needed with pre-LN).

    Args:
        layers: the N ``EncoderLayer`` modules, applied in order.
        norm: final LayerNorm, or None.
    """

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
        skip_padding: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """x (B, S, D) -> (B, S, D); masks as in ``EncoderLayer``.

        With ``output_hidden_states`` also returns the N + 1 hidden states: the input, then
        every layer's output (the last one before the final norm, as Hugging Face does).

        With ``skip_padding`` (and a ``key_padding_mask``) the layers compute the real tokens
        only (:mod:`scratchformer.fast.packing`): padded positions cost next to nothing and come out
        as zeros, as in ``torch.nn.TransformerEncoder``'s fast path. Real positions are unchanged.
        """
        if _all_real(key_padding_mask, x):
            key_padding_mask = None  # no padding at all: attention may run its unmasked (fastest) kernel
        packing = Packing.from_mask(key_padding_mask) if skip_padding and key_padding_mask is not None else None
        hidden = [x]
        h = x if packing is None else packing.pack(x)
        for layer in self.layers:
            h = layer(h, key_padding_mask, attn_mask, packing=packing)
            if output_hidden_states:
                hidden.append(h if packing is None else packing.unpack(h))
        if self.norm is not None:
            h = self.norm(h)
        x = h if packing is None else packing.unpack(h)
        return (x, hidden) if output_hidden_states else x
