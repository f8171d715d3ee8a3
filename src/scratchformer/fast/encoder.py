"""The encoder stack with two shortcuts around padding: the same values as
:class:`scratchformer.core.encoder.Encoder` at every real position.

* A padding mask that marks every position real is dropped (read once on the host), so attention
  runs its unmasked, fastest kernel.
* With ``skip_padding`` the layers compute the N real tokens only (:mod:`.packing`): projections,
  feed-forward, LayerNorms and residuals run on an (N, D) matrix; only attention itself unpacks to
  (B, T). Padded positions come out as zeros, as in ``torch.nn.TransformerEncoder``'s
  nested-tensor fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.core.attention import MultiHeadAttention, scaled_dot_product_attention
from scratchformer.core.checks import check_features
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.core.masks import expand_attention_mask
from scratchformer.fast.packing import Packing

__all__ = ["FastEncoder"]


class FastEncoder(Encoder):
    """:class:`Encoder` (same parameters) with the padding shortcuts; ``skip_padding`` is set by
    :func:`scratchformer.fast.optimize`. With hooks on its attention modules (attention maps) it
    runs the readable path, which calls them."""

    skip_padding: bool = False

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                output_hidden_states: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """As :meth:`Encoder.forward`; with ``skip_padding`` the output is zero at padded positions."""
        if _all_real(key_padding_mask, x):
            key_padding_mask = None  # no padding at all: attention may run its unmasked kernel
        if not self.skip_padding or key_padding_mask is None or _watched(self):
            return super().forward(x, key_padding_mask, attn_mask, output_hidden_states)
        check_features("x", x, "(B, S, D)", None)
        packing = Packing.from_mask(key_padding_mask)
        heads = self.layers[0].self_attn.num_heads if len(self.layers) else 1
        mask = expand_attention_mask(key_padding_mask, attn_mask, x.shape[0], heads, x.shape[1], x.shape[1])
        hidden, h = [x], packing.pack(x)  # (N, D)
        for layer in self.layers:
            h = _packed_layer(layer, h, packing, mask)
            if output_hidden_states:
                hidden.append(packing.unpack(h))
        out = packing.unpack(h if self.norm is None else self.norm(h))
        return (out, hidden) if output_hidden_states else out


def _watched(encoder: Encoder) -> bool:
    """Whether hooks watch an attention module (attention maps): the packed path would not call it."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in encoder.modules() if isinstance(m, MultiHeadAttention))


def _all_real(key_padding_mask: Tensor | None, x: Tensor) -> bool:
    """Whether a well-formed (B, S) bool padding mask marks every position real (reads it on the host)."""
    return (key_padding_mask is not None and key_padding_mask.dtype == torch.bool
            and tuple(key_padding_mask.shape) == tuple(x.shape[:2]) and not torch.compiler.is_compiling()
            and bool(key_padding_mask.all()))


def _packed_layer(layer: EncoderLayer, h: Tensor, packing: Packing, mask: Tensor | None) -> Tensor:
    """``EncoderLayer.forward`` on packed tokens h (N, D): the same sub-layers and residuals."""
    def sa_block(y: Tensor) -> Tensor:
        return layer.dropout1(_packed_self_attention(layer.self_attn, y, packing, mask))

    if layer.norm_first:
        h = h + sa_block(layer.norm1(h))
        return h + layer._ff_block(layer.norm2(h))
    h = layer.norm1(h + sa_block(h))
    return layer.norm2(h + layer._ff_block(h))


def _packed_self_attention(attn: MultiHeadAttention, x: Tensor, packing: Packing, mask: Tensor | None) -> Tensor:
    """Self-attention of packed tokens x (N, D) -> (N, D): the projections on the N tokens, the
    attention itself on the unpacked (B, H, T, T) grid under ``mask``."""
    B, T, D = packing.batch, packing.length, attn.d_model
    q, k, v = (attn._split_heads(packing.unpack(t)) for t in attn.qkv_proj(x).split(D, dim=-1))  # (B, H, T, d_k)
    out, _ = scaled_dot_product_attention(q, k, v, mask, dropout_p=attn.dropout if attn.training else 0.0,
                                          scale=attn.scale)
    return attn.out_proj(packing.pack(out.transpose(1, 2).reshape(B, T, D)))
