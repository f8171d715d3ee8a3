"""The encoder stack and layer, fast: the same values as :mod:`scratchformer.core.encoder` at
every real position, with

* the mask checked and merged once per stack (:class:`~.attention.StackMask`), not per layer;
* residuals added in place into the sub-layer's fresh output (one (B, T, D) tensor fewer each);
* a padding mask that marks every position real dropped (read on the host, CPU only: no device
  sync on a GPU), so attention runs its unmasked kernel;
* with ``skip_padding``, the N real tokens only (:mod:`.packing`, which reads the mask on the
  host): projections, feed-forward, LayerNorms and residuals on an (N, D) matrix, attention on CPU
  sequence by sequence on each one's own tokens (variable length); on a GPU, or with an
  ``attn_mask`` as well, on the unpacked (B, T) grid under the mask. Padded positions come out as
  zeros, as in ``torch.nn.TransformerEncoder``'s nested-tensor fast path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.checks import check_features
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.fast.attention import (
    StackMask,
    packed_self_attention,
    padded_self_attention,
    self_attention,
)
from scratchformer.fast.feedforward import dropout
from scratchformer.fast.packing import Packing

__all__ = ["FastEncoder", "FastEncoderLayer"]

Attention = Callable[[MultiHeadAttention, Tensor], Tensor]  # (module, x) -> attention output, x's shape


def _residual(x: Tensor, fresh: Tensor) -> Tensor:
    """x + fresh, written into ``fresh`` (a sub-layer's new output, saved by nothing) when it can be."""
    return fresh.add_(x) if fresh.dtype == x.dtype and fresh.shape == x.shape else x + fresh


class FastEncoderLayer(EncoderLayer):
    """:class:`EncoderLayer` (same parameters) with residuals in place; in a :class:`FastEncoder`
    it takes the stack's prepared mask."""

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        """As :meth:`EncoderLayer.forward`."""
        if _watched(self):
            return super().forward(x, key_padding_mask, attn_mask)
        check_features("x", x, "(B, S, D)", self.self_attn.d_model)
        B, S, _ = x.shape
        mask = StackMask.build(key_padding_mask, attn_mask, B, self.self_attn.num_heads, S, S)
        return self.sublayers(x, lambda attn, y: self_attention(attn, y, mask))

    def sublayers(self, x: Tensor, attention: Attention) -> Tensor:
        """The two residual sub-layers around ``attention`` (post-LN, or pre-LN with norm_first);
        x may be (B, T, D) or packed (N, D)."""

        def ff_block(y: Tensor) -> Tensor:
            return dropout(self.dropout2, self.feed_forward(y))

        if self.norm_first:
            x = _residual(x, dropout(self.dropout1, attention(self.self_attn, self.norm1(x))))
            return _residual(x, ff_block(self.norm2(x)))
        x = self.norm1(_residual(x, dropout(self.dropout1, attention(self.self_attn, x))))
        return self.norm2(_residual(x, ff_block(x)))


class FastEncoder(Encoder):
    """:class:`Encoder` (same parameters) whose stack prepares the mask once; ``skip_padding`` is
    set by :func:`scratchformer.fast.optimize`. With hooks on a layer or any of its modules
    (attention maps, activation capture) it runs the readable path, which calls them."""

    skip_padding: bool = False

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """As :meth:`Encoder.forward`; with ``skip_padding`` the output is zero at padded positions."""
        if _all_real(key_padding_mask, x):
            key_padding_mask = None  # no padding at all: attention may run its unmasked kernel
        if any(type(layer) is not FastEncoderLayer or _watched(layer) for layer in self.layers):
            return super().forward(x, key_padding_mask, attn_mask, output_hidden_states)
        first = self.layers[0].self_attn if len(self.layers) else None
        check_features("x", x, "(B, S, D)", first.d_model if first is not None else None)
        B, T = x.shape[:2]
        heads = first.num_heads if first is not None else 1
        packing = (
            Packing.from_mask(key_padding_mask)
            if self.skip_padding and key_padding_mask is not None
            else None
        )
        # each sequence on its own real tokens, no mask at all (on CPU; on a GPU one masked call is cheaper)
        per_sequence = packing is not None and attn_mask is None and x.device.type == "cpu"
        mask = (
            StackMask(None, None)
            if per_sequence
            else StackMask.build(key_padding_mask, attn_mask, B, heads, T, T)
        )
        attention: Attention
        unpack: Callable[[Tensor], Tensor]
        if packing is None:
            attention, unpack, h = (lambda attn, y: self_attention(attn, y, mask)), (lambda y: y), x
        elif per_sequence:
            attention = lambda attn, y: packed_self_attention(attn, y, packing.lengths)  # noqa: E731
            unpack, h = packing.unpack, packing.pack(x)  # (N, D)
        else:
            attention = lambda attn, y: padded_self_attention(attn, y, packing, mask)  # noqa: E731
            unpack, h = packing.unpack, packing.pack(x)
        hidden = [x]
        for layer in self.layers:
            h = layer.sublayers(h, attention)
            if output_hidden_states:
                hidden.append(unpack(h))
        out = unpack(h if self.norm is None else self.norm(h))
        return (out, hidden) if output_hidden_states else out


def _watched(layer: EncoderLayer) -> bool:
    """Whether hooks watch the layer or one of its modules (attention maps, activation capture): the
    fast path would not call the layer or its attention module, and adds residuals in place."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules())


def _all_real(key_padding_mask: Tensor | None, x: Tensor) -> bool:
    """Whether a well-formed (B, S) bool padding mask marks every position real (read on the host,
    so on CPU only: on a GPU it would wait for the device)."""
    return (
        key_padding_mask is not None
        and key_padding_mask.dtype == torch.bool
        and x.device.type == "cpu"
        and key_padding_mask.device.type == "cpu"
        and tuple(key_padding_mask.shape) == tuple(x.shape[:2])
        and not torch.compiler.is_compiling()
        and bool(key_padding_mask.all())
    )
