"""Attention, fast: for the encoder, the mask prepared once per stack and attention over packed
real tokens one sequence at a time (variable length), so padding costs nothing in attention
either; for decoding, a single bf16 query attends in fp32 by the explicit formula. The same
values as :class:`scratchformer.core.attention.MultiHeadAttention`.

The core attention checks and merges its masks, and finds the queries that may attend to no key,
in every layer; here a stack does it once (:class:`StackMask`) and every layer reuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.attention import HALF, MultiHeadAttention, scaled_dot_product_attention
from scratchformer.core.masks import expand_attention_mask
from scratchformer.fast.packing import Packing

__all__ = [
    "FastMultiHeadAttention",
    "StackMask",
    "packed_self_attention",
    "padded_self_attention",
    "self_attention",
]


@dataclass
class StackMask:
    """One stack's attention mask, checked and merged once for all its layers.

    Attributes:
        mask: (B|1, H|1, T|1, S) bool, True = may attend, with the queries that may attend to no
            key opened to every key (they are zeroed afterwards), or None (no mask).
        no_key: (B|1, H|1, T|1, 1) bool, True at the queries that may attend to no key, or None.
    """

    mask: Tensor | None
    no_key: Tensor | None

    @classmethod
    def build(
        cls, key_padding_mask: Tensor | None, attn_mask: Tensor | None, batch: int, heads: int, T: int, S: int
    ) -> StackMask:
        """From the masks of :meth:`MultiHeadAttention.forward` (checked here, as there)."""
        mask = expand_attention_mask(key_padding_mask, attn_mask, batch, heads, T, S)
        if mask is None:
            return cls(None, None)
        no_key = ~mask.any(dim=-1, keepdim=True)
        return cls(mask | no_key, no_key)


def _attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """The fused kernel on (B, H, L, d_k) heads, with the layer's scale and dropout."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=attn.dropout if attn.training else 0.0, scale=attn.scale
    )


def _heads_attention(attn: MultiHeadAttention, qkv: Tensor, stack_mask: StackMask) -> Tensor:
    """Stacked projections qkv (B, T, 3D) -> the heads' attention, concatenated: (B, T, D)."""
    B, T, D = qkv.shape[0], qkv.shape[1], attn.d_model
    q, k, v = qkv.view(B, T, 3, attn.num_heads, attn.d_k).permute(2, 0, 3, 1, 4)  # (B, H, T, d_k) each
    out = _attend(attn, q, k, v, stack_mask.mask)
    if stack_mask.no_key is not None:
        out = out.masked_fill(stack_mask.no_key, 0.0)
    return out.transpose(1, 2).reshape(B, T, D)


def self_attention(attn: MultiHeadAttention, x: Tensor, stack_mask: StackMask) -> Tensor:
    """``attn(x)[0]`` for x (B, T, D) under a prepared mask: (B, T, D)."""
    return attn.out_proj(_heads_attention(attn, attn.qkv_proj(x), stack_mask))


def padded_self_attention(
    attn: MultiHeadAttention, x: Tensor, packing: Packing, stack_mask: StackMask
) -> Tensor:
    """Self-attention of packed tokens x (N, D) on the unpacked (B, T) grid under a prepared mask:
    the projections on the N tokens, the attention itself padded (N, D)."""
    return attn.out_proj(packing.pack(_heads_attention(attn, packing.unpack(attn.qkv_proj(x)), stack_mask)))


def packed_self_attention(attn: MultiHeadAttention, x: Tensor, lengths: list[int]) -> Tensor:
    """Self-attention of packed tokens x (N, D), sequence after sequence (``lengths``, summing to
    N), each attending to its own tokens only: (N, D). No padding is computed or masked."""
    qkv, no_mask = attn.qkv_proj(x), StackMask(None, None)  # (N, 3D)
    outs = [
        _heads_attention(attn, part[None], no_mask)[0] for part in qkv.split(lengths) if len(part)
    ]  # (n, D) each
    out = torch.cat(outs) if len(outs) > 1 else outs[0] if outs else qkv.new_zeros(0, attn.d_model)
    return attn.out_proj(out)


class FastMultiHeadAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` (same parameters) whose single query in bf16/fp16 on CPU (a
    decoding step with the KV cache) attends by the core's explicit formula in fp32: ATen's fused
    CPU kernel takes 1.6-2.3x as long there at 24-64 keys (``benchmarks/fast_path_micro.py``), and
    fp32 scores are also more exact."""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        if (
            q.shape[-2] == 1
            and q.dtype in HALF
            and q.device.type == "cpu"
            and not (self.training and self.dropout)
        ):
            out, weights = scaled_dot_product_attention(
                q.float(),
                k.float(),
                v.float(),
                mask,
                is_causal=is_causal,
                need_weights=True,
                scale=self.scale,
            )
            return out.to(q.dtype), weights.to(q.dtype) if need_weights and weights is not None else None
        return super()._attend(q, k, v, mask, is_causal, need_weights)
