"""Token sequences in training: right-padding id lists into a batch and the label-smoothed loss
over the real tokens (the translation, captioning and masked-LM tasks share them)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.training.precision import at_least_fp32

__all__ = ["label_smoothed_loss", "pad_ids"]


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> Tensor:
    """Cross-entropy with label smoothing (paper, 5.4: eps_ls = 0.1), averaged over non-pad tokens.

    logits (B, T, V), target (B, T): the target distribution puts 1 - eps on the gold token and
    eps spread uniformly over the vocabulary (PyTorch's ``label_smoothing``); padding positions
    contribute nothing.
    """
    return F.cross_entropy(
        at_least_fp32(logits).flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=smoothing
    )


def pad_ids(
    sequences: Sequence[Sequence[int]], device: torch.device | str = "cpu", pad_id: int = 0
) -> Tensor:
    """Token id lists of different lengths -> (B, L_max) long tensor, right-padded with ``pad_id``."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)
