"""BERT's masked-language-model corruption (Devlin et al. 2019, section 3.1 and appendix A.1).

Each real, non-special token is chosen as a prediction target with probability ``rate`` (15%).
A chosen token is replaced by [MASK] 80% of the time, by a random token 10% of the time, and kept
10% of the time; the model must predict the original token at every chosen position. Special
tokens ([CLS], [SEP]) and padding are never chosen. With ``whole_word``, the choice is made once
per word: a WordPiece continuation ("##ing") is chosen exactly when its word's first piece is.

Usage::

    inputs, targets = mask_tokens(ids, maskable, mask_id=4, replacements=ids_of_normal_tokens,
                                  generator=torch.Generator().manual_seed(0))
    loss = cross_entropy(logits[targets != IGNORE], targets[targets != IGNORE])
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["IGNORE", "check_masking", "continuation_table", "mask_tokens"]

IGNORE = -100  # the target of a position that is not predicted (PyTorch's ignore_index default)


def continuation_table(vocabulary: dict[str, int], prefix: str = "##") -> Tensor:
    """(V,) bool: True for the WordPiece tokens that continue a word (``##``-prefixed)."""
    table = torch.zeros(max(vocabulary.values()) + 1, dtype=torch.bool)
    for token, index in vocabulary.items():
        table[index] = token.startswith(prefix) and len(token) > len(prefix)
    return table


def check_masking(rate: float, mask_fraction: float, random_fraction: float) -> None:
    """``rate`` in (0, 1); the [MASK] and random shares >= 0 and together at most 1."""
    if not (
        0.0 < rate < 1.0
        and mask_fraction >= 0
        and random_fraction >= 0
        and mask_fraction + random_fraction <= 1
    ):
        raise ValueError(
            f"mask_rate must be in (0, 1) and mask_fraction + random_fraction <= 1 (both >= 0), got "
            f"{rate}, {mask_fraction}, {random_fraction}"
        )


def mask_tokens(
    ids: Tensor,
    maskable: Tensor,
    mask_id: int,
    replacements: Tensor,
    generator: torch.Generator,
    rate: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    continuation: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Corrupt a batch for masked-language-model training.

    Args:
        ids: (B, L) token ids.
        maskable: (B, L) bool, True where a token may be chosen (real and not special).
        mask_id: the [MASK] id.
        replacements: (K,) the ids a random replacement is drawn from (the ordinary tokens).
        generator: the CPU generator every draw comes from (the same seed, the same corruption).
        rate: probability that a token (a word, with ``continuation``) is chosen.
        mask_fraction, random_fraction: of the chosen tokens, the share replaced by [MASK] and by a
            random token; the rest are kept.
        continuation: (B, L) bool, True at pieces that continue the previous token's word: whole-word
            masking.

    Returns:
        inputs (B, L): ``ids`` corrupted; targets (B, L): the original id at chosen positions,
        :data:`IGNORE` elsewhere.
    """
    if ids.shape != maskable.shape or (continuation is not None and continuation.shape != ids.shape):
        raise ValueError(
            f"ids {tuple(ids.shape)}, maskable {tuple(maskable.shape)} "
            "and continuation must have one shape (B, L)"
        )
    check_masking(rate, mask_fraction, random_fraction)
    if replacements.numel() == 0:
        raise ValueError("replacements: no ordinary token ids to draw random replacements from")
    cpu_ids = ids.cpu()
    draw = torch.rand(cpu_ids.shape, generator=generator)
    if continuation is not None:  # every piece takes the draw of its word's first piece
        position = torch.arange(ids.shape[1]).expand_as(cpu_ids)
        word_start = torch.where(continuation.cpu(), 0, position).cummax(dim=1).values
        draw = draw.gather(1, word_start)
    chosen = (draw < rate) & maskable.cpu()
    action = torch.rand(cpu_ids.shape, generator=generator)
    to_mask = chosen & (action < mask_fraction)
    to_random = chosen & (action >= mask_fraction) & (action < mask_fraction + random_fraction)
    random_ids = replacements.cpu()[torch.randint(len(replacements), cpu_ids.shape, generator=generator)]
    inputs = torch.where(to_mask, mask_id, torch.where(to_random, random_ids, cpu_ids))
    targets = torch.where(chosen, cpu_ids, IGNORE)
    return inputs.to(ids.device), targets.to(ids.device)
