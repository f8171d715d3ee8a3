"""Attention masks. THE MASK CONVENTION, the only one used anywhere in scratchformer:
a mask is a ``torch.bool`` tensor and ``True`` means *may attend*.

* ``padding_mask(tokens, pad_id)`` is ``True`` at real tokens and ``False`` at padding.
* ``causal_mask(T)`` is ``True`` on and below the diagonal: position i may look at 0..i.
* Masks combine with logical AND (``combine_masks``): a key is visible only if every mask allows it.

Float "additive" masks (0 / -inf) and PyTorch's opposite polarity (True = blocked) are rejected
with a ``TypeError``, never silently misread. Shapes (T queries, S keys): key-padding ``(B, S)``;
attention ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``. ``expand_attention_mask`` checks and merges
them into one ``(B|1, H|1, T|1, S)`` tensor; a stack does this once, its layers only check the shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.core.checks import check_mask

__all__ = ["causal_mask", "combine_masks", "expand_attention_mask", "fold_causal", "padding_mask"]


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:  # (B, T) ids -> (B, T) bool, True at real tokens
    if tokens.dim() != 2:
        raise ValueError(f"tokens: expected shape (B, T), got {tuple(tokens.shape)} ({tokens.dim()} dims)")
    return tokens != pad_id


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """``(T, S)`` bool "no-peek" mask, True where query i may attend key j. With ``S > T`` (decoding
    with a cache) the T queries are the last T positions: query i sees keys ``0 .. i + S - T``."""
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
        try:
            result = mask if result is None else result & mask
        except RuntimeError:
            raise ValueError(
                f"combine_masks: mask {i} of shape {tuple(mask.shape)} does not broadcast with "
                f"the masks before it, combined shape {tuple(result.shape)}"
            ) from None
    return result


def fold_causal(
    mask: Tensor | None, is_causal: bool, T: int, S: int, device: torch.device, force: bool = False
) -> tuple[Tensor | None, bool]:
    """(mask, is_causal) with the causal mask ANDed into ``mask``, unless the fused kernel can apply
    it alone (``is_causal`` with no other mask and T == S, and not ``force``). A single query (the
    last position, as when decoding with a cache) may see every key: nothing to hide."""
    if is_causal and T == 1:
        return mask, False
    if is_causal and (mask is not None or force or T != S):
        return combine_masks(mask, causal_mask(T, S, device=device)), False
    return mask, is_causal


def expand_attention_mask(
    key_padding_mask: Tensor | None, attn_mask: Tensor | None, batch: int, heads: int, T: int, S: int
) -> Tensor | None:
    """Check and merge ``key_padding_mask`` (B, S), True at real keys, and ``attn_mask`` (T, S),
    (B, T, S) or (B, H, T, S), True = may attend, into one bool (B|1, H|1, T|1, S) tensor, or None."""
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
            broadcast=True,
        )
        attn_mask = {2: attn_mask[None, None], 3: attn_mask[:, None]}.get(
            attn_mask.dim(), attn_mask
        )  # 4 dims
        merged = attn_mask if merged is None else merged & attn_mask
    return merged
