"""Attention masks.

THE MASK CONVENTION (the only one used anywhere in scratchformer)
-----------------------------------------------------------------
A mask is a ``torch.bool`` tensor and ``True`` means *may attend*.

* ``padding_mask(tokens, pad_id)`` is ``True`` at real tokens and ``False`` at padding.
* ``causal_mask(T)`` is ``True`` on and below the diagonal: position i may look at 0..i.
* Masks combine with logical AND (``combine_masks``): a key is visible only if every mask allows it.

Float "additive" masks (0 / -inf) and PyTorch's opposite boolean polarity (True = blocked) are
rejected with a ``TypeError`` rather than silently misread.

Shapes (T = query length, S = key length; in self-attention S == T):

* key-padding mask ``(B, S)``
* attention mask ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``

``expand_attention_mask`` turns any of these into one ``(B or 1, H or 1, T, S)`` tensor that
broadcasts against the attention scores ``(B, H, T, S)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.core.checks import check_mask

__all__ = ["causal_mask", "combine_masks", "expand_attention_mask", "padding_mask"]


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """``(B, T)`` bool, True at real tokens, from token ids ``tokens`` ``(B, T)``."""
    if tokens.dim() != 2:
        raise ValueError(
            f"tokens: expected shape (B, T), got {tuple(tokens.shape)} ({tokens.dim()} dims)"
        )
    return tokens != pad_id


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """``(T, S)`` bool "no-peek" mask, True where query i may attend key j.

    With ``S > T`` the T queries are the *last* T positions of an S-long sequence (incremental
    decoding with a cache): query i sits at absolute position ``i + S - T`` and sees keys
    ``0 .. i + S - T``.
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask: need 0 <= T <= S, got T={T}, S={S}")
    query_pos = torch.arange(S - T, S, device=device).unsqueeze(1)  # (T, 1)
    key_pos = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return key_pos <= query_pos


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable bool masks; ``None`` entries are ignored (allow everything)."""
    result: Tensor | None = None
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"combine_masks: mask {i} must be torch.bool, got {mask.dtype}")
        if result is not None:
            try:
                torch.broadcast_shapes(result.shape, mask.shape)
            except RuntimeError:
                raise ValueError(
                    f"combine_masks: mask {i} of shape {tuple(mask.shape)} does not broadcast with "
                    f"the masks before it, combined shape {tuple(result.shape)}"
                ) from None
        result = mask if result is None else result & mask
    return result


def expand_attention_mask(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    batch: int,
    heads: int,
    T: int,
    S: int,
) -> Tensor | None:
    """Validate and merge masks into one bool tensor of shape ``(B|1, H|1, T, S)`` (or None).

    Args:
        key_padding_mask: ``(B, S)`` bool, True at keys that exist.
        attn_mask: ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)`` bool, True where attention is allowed.
    """
    merged = None
    if key_padding_mask is not None:
        check_mask("key_padding_mask", key_padding_mask, [(batch, S)], ["(B, S)"])
        merged = key_padding_mask[:, None, None, :]
    if attn_mask is not None:
        check_mask(
            "attn_mask",
            attn_mask,
            [(T, S), (batch, T, S), (batch, heads, T, S)],
            ["(T, S)", "(B, T, S)", "(B, H, T, S)"],
        )
        if attn_mask.dim() == 2:
            attn_mask = attn_mask[None, None]
        elif attn_mask.dim() == 3:
            attn_mask = attn_mask[:, None]
        merged = attn_mask if merged is None else merged & attn_mask
    return merged
