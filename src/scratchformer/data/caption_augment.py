"""Augmenting captioned photos in the grid of regions their encoder made, so that the cached
features serve every epoch: a left-right flip (with "left" and "right" swapped in the captions) and
a random crop resized back to the grid::

    regions (B, R, C), R = g * g, row by row
    flip:  x[b, i, j] <- x[b, i, g - 1 - j]          for the photos drawn (half of those allowed)
    crop:  a random s x s window, ceil(crop * g) <= s <= g, resized (bilinear) back to g x g

Both act on feature maps, not pixels: a convolution network's features of a mirrored photo are close
to its mirrored features (ImageNet training flips its photos), not equal to them. A photo whose
captions mention writing or numbers (:data:`WRITING`, or a digit) is never flipped: mirrored text
would no longer say what the caption says.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.data.captions import caption_words

__all__ = ["WRITING", "RegionAugment", "flippable", "mirror_words"]

MIRRORED = {"left": "right", "right": "left"}
WRITING = frozenset(
    "sign signs says reads written writing words letters lettering banner billboard text number "
    "numbers numbered graffiti logo".split()
)


def mirror_words(words: Sequence[str]) -> list[str]:
    """The words of a caption of the mirrored photo: "left" and "right" swapped."""
    return [MIRRORED.get(w, w) for w in words]


def flippable(references: Sequence[str]) -> bool:
    """Whether a photo may be mirrored: none of its captions has a digit or a word of :data:`WRITING`."""
    return not any(
        any(c.isdigit() for c in ref) or WRITING.intersection(caption_words(ref)) for ref in references
    )


class RegionAugment:
    """Random flips and crops of region features (B, g*g, C) (see the module docstring).

    Args:
        flip: mirror each allowed photo with probability 1/2.
        crop: the least side of the crop window as a fraction of the grid (1.0: no crop).
    """

    def __init__(self, flip: bool = False, crop: float = 1.0):
        if not 0 < crop <= 1:
            raise ValueError(f"crop must be in (0, 1], got {crop}")
        self.flip, self.crop = flip, crop

    def __call__(
        self, regions: Tensor, allowed: Sequence[bool], rng: random.Random
    ) -> tuple[Tensor, list[bool]]:
        """Regions (B, R, C) -> (augmented (B, R, C) in their dtype, which photos were mirrored)."""
        B, R, C = regions.shape
        g = math.isqrt(R)
        if g * g != R:
            raise ValueError(f"augment: {R} regions are not a square grid")
        flipped = [self.flip and ok and rng.random() < 0.5 for ok in allowed]
        x = regions.view(B, g, g, C)
        if any(flipped):
            x = torch.where(torch.tensor(flipped, device=x.device)[:, None, None, None], x.flip(2), x)
        if self.crop < 1:
            least = max(1, math.ceil(self.crop * g))
            rows = []
            for b in range(B):
                s = rng.randint(least, g)
                top, left = rng.randint(0, g - s), rng.randint(0, g - s)
                window = x[b, top : top + s, left : left + s].permute(2, 0, 1)[None].float()  # (1, C, s, s)
                if s != g:
                    window = F.interpolate(window, size=(g, g), mode="bilinear", align_corners=False)
                rows.append(window[0].permute(1, 2, 0))
            x = torch.stack(rows).to(regions.dtype)
        return x.reshape(B, R, C), flipped
