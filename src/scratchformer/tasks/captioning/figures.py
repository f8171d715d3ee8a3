"""Figures of a captioning model's output: captions under their images, and each word's attention
over the image. Imports nothing else of the package: the caller brings the images, words and
weights (:meth:`~scratchformer.tasks.captioning.Captioner.plot_attention` records the attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["plot_caption_attention", "plot_caption_attention_rows", "plot_caption_examples"]


def plot_caption_attention(
    image: Tensor, words: Sequence[str], attention: Tensor, grid: int, path: str | Path
) -> None:
    """For each word, the image (C, H, W) with its attention over the grid x grid patches overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pixels = image.permute(1, 2, 0).cpu().float()
    pixels = pixels / 255.0 if image.dtype == torch.uint8 else pixels
    size = image.shape[-1]
    cols = min(6, len(words))
    rows = (len(words) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.2 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(words):
            continue
        heat = attention[i].reshape(1, 1, grid, grid).float()
        heat = F.interpolate(heat, size=(size, size), mode="bilinear", align_corners=False)[0, 0]
        ax.imshow(pixels.numpy())
        ax.imshow(heat.numpy(), cmap="inferno", alpha=0.55)
        ax.set_title(words[i], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def plot_caption_attention_rows(
    images: Sequence[Tensor],
    words: Sequence[Sequence[str]],
    attention: Sequence[Tensor],
    grid: int,
    titles: Sequence[str],
    path: str | Path,
    max_words: int = 8,
) -> None:
    """One row per image (C, H, W): the image under its title, then its first ``max_words`` words,
    each over its (L, grid * grid) attention, overlaid as in :func:`plot_caption_attention`."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 1 + max(min(max_words, len(w)) for w in words)
    fig, axes = plt.subplots(len(images), cols, figsize=(1.7 * cols, 2.0 * len(images)), squeeze=False)
    for row, image, row_words, weights, title in zip(axes, images, words, attention, titles):
        pixels = (
            image.permute(1, 2, 0).cpu().float() / (255.0 if image.dtype == torch.uint8 else 1.0)
        ).numpy()
        size = image.shape[-1]
        for ax in row:
            ax.axis("off")
        row[0].imshow(pixels)
        row[0].set_title(textwrap.fill(title, 26), fontsize=6.5, loc="left")
        for ax, word, heat in zip(row[1:], row_words[:max_words], weights):
            heat = F.interpolate(
                heat.reshape(1, 1, grid, grid).float(),
                size=(size, size),
                mode="bilinear",
                align_corners=False,
            )[0, 0]
            ax.imshow(pixels)
            ax.imshow(heat.numpy(), cmap="inferno", alpha=0.55)
            ax.set_title(word, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_caption_examples(
    images: Tensor,
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    path: str | Path,
    title: str = "",
    *,
    matches: Sequence[bool] | None = None,
) -> None:
    """A row of images (N, C, H, W), each with the model's caption and its first two references below;
    ``matches``: whether each caption equals one of its references (shown below it; None: not shown)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(images)
    fig, axes = plt.subplots(1, n, figsize=(3.0 * n, 5.0), squeeze=False)
    shown = [None] * n if matches is None else list(matches)
    for ax, image, hyp, refs, same in zip(axes[0], images, hypotheses, references, shown):
        pixels = image.permute(1, 2, 0).float() / (255.0 if image.dtype == torch.uint8 else 1.0)
        ax.imshow(pixels.numpy())
        ax.set_xticks([])
        ax.set_yticks([])
        match = [] if same is None else [f"({'exact match' if same else 'differs from every reference'})"]
        lines = [textwrap.fill(f"model: {hyp}", 38), *match, "references:"]
        lines += [textwrap.fill(f"- {r}", 38) for r in refs[:2]]
        ax.text(0.0, -0.04, "\n".join(lines), transform=ax.transAxes, va="top", ha="left", fontsize=7.5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.93 if title else 0.98, bottom=0.36, wspace=0.08)
    fig.savefig(path, dpi=110)
    plt.close(fig)
