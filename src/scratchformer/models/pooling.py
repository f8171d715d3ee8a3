"""From token vectors (B, L, D) to one vector per sequence (B, D)."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

__all__ = ["POOLING_MODES", "masked_mean", "pool"]

POOLING_MODES = ("mean", "cls")


def masked_mean(hidden: Tensor, padding_mask: Tensor) -> Tensor:
    """Mean over real tokens: hidden (B, L, D), padding_mask (B, L) bool -> (B, D).

    Padding positions contribute exactly nothing, so extra padding never changes the result;
    an all-padding row gives zeros, not NaN.
    """
    weights = padding_mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def pool(hidden: Tensor, padding_mask: Tensor, mode: str = "mean", normalize: bool = False) -> Tensor:
    """Pool (B, L, D) to (B, D): "mean" over real tokens, or "cls" (the first position);
    ``normalize`` scales each vector to unit L2 norm (sentence-transformers' Normalize)."""
    if mode == "mean":
        out = masked_mean(hidden, padding_mask)
    elif mode == "cls":
        out = hidden[:, 0]
    else:
        raise ValueError(f"pooling mode: expected one of {POOLING_MODES}, got {mode!r}")
    return F.normalize(out, p=2.0, dim=-1) if normalize else out
