"""The walkthrough's figures (docs/paper.md), drawn from the library's own functions:

* ``paper_positions.png``: the sinusoidal table of section 3.5 (``sinusoidal_table``), and four of its
  dimensions along the positions;
* ``paper_masks.png``: the four masks of a padded batch with S != T (``padding_mask``, ``causal_mask``,
  ``combine_masks``): the encoder's self-attention, the decoder's no-peek mask, the decoder's
  combined self-attention mask and the cross-attention mask;
* ``paper_schedule.png``: the warm-up schedule of section 5.3, the paper's formula against our
  ``lr_multiplier("inverse_sqrt")``, with the cosine and linear schedules the recipes use.

    python scripts/figures/docs_figures.py                 # writes docs/figures/paper_*.png
    python scripts/figures/docs_figures.py --out /tmp/figs

The attention map of the walkthrough is the demo's
(``scratchformer demo --figure docs/figures/demo_attention.png``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from scratchformer.core.embedding import sinusoidal_table  # noqa: E402
from scratchformer.core.masks import causal_mask, combine_masks, padding_mask  # noqa: E402
from scratchformer.training.schedule import lr_multiplier  # noqa: E402

PAD = 0
ALLOWED = ListedColormap(["#d9d9d9", "#2b8cbe"])  # False (hidden) grey, True (may attend) blue


def positions_figure(path: Path, length: int = 100, d_model: int = 128) -> None:
    table = sinusoidal_table(length, d_model)  # (L, D)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.4), height_ratios=[3, 2])
    image = top.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    top.set(
        title=f"sinusoidal_table({length}, {d_model}): PE[pos, dimension]",
        xlabel="position",
        ylabel="dimension (even: sin, odd: cos)",
    )
    fig.colorbar(image, ax=top, fraction=0.03)
    for dim in (0, 1, 16, 64):
        kind = "sin" if dim % 2 == 0 else "cos"
        bottom.plot(
            table[:, dim].numpy(),
            label=f"dimension {dim} ({kind}, wavelength "
            f"{2 * torch.pi * 10000 ** ((dim - dim % 2) / d_model):.0f})",
        )
    bottom.set(xlabel="position", ylabel="PE", xlim=(0, length - 1))
    bottom.legend(fontsize=8, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def masks_figure(path: Path) -> None:
    """One batch of two sentence pairs, right-padded: sources of 5 and 3 tokens (S = 5), targets of
    4 and 2 tokens (T = 4). The pictures show the masks of the second pair, the padded one."""
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, PAD, PAD]])  # (B, S)
    tgt = torch.tensor([[1, 4, 4, 4], [1, 4, PAD, PAD]])  # (B, T)
    S, T = src.shape[1], tgt.shape[1]
    src_real, tgt_real = padding_mask(src, PAD), padding_mask(tgt, PAD)  # (B, S), (B, T)
    panels = [
        (
            "encoder self-attention\npadding, (B, S) over S queries",
            src_real[:, None, :].expand(-1, S, -1)[1],
            "source keys",
            "source queries",
        ),
        ("decoder no-peek\ncausal_mask(T), (T, T)", causal_mask(T), "target keys", "target queries"),
        (
            "decoder self-attention\ncombine_masks(no-peek, target padding)",
            combine_masks(causal_mask(T), tgt_real[:, None, :])[1],
            "target keys",
            "target queries",
        ),
        (
            "cross-attention\nsource padding, (T, S)",
            src_real[:, None, :].expand(-1, T, -1)[1],
            "source keys (memory)",
            "target queries",
        ),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 4.2))
    for ax, (title, mask, xlabel, ylabel) in zip(axes, panels):
        ax.imshow(mask.int().numpy(), cmap=ALLOWED, vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.set_xticks(range(mask.shape[1]))
        ax.set_yticks(range(mask.shape[0]))
        for (i, j), value in _cells(mask):
            ax.text(
                j,
                i,
                "T" if value else "F",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value else "#555555",
            )
    fig.suptitle(
        "True = may attend (blue). Second sentence pair of a batch: source 3 real tokens of S = 5, "
        "target 2 of T = 4",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cells(mask: torch.Tensor):
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            yield (i, j), bool(mask[i, j])


def schedule_figure(path: Path, d_model: int = 512, warmup: int = 4000, steps: int = 100_000) -> None:
    step = torch.arange(1, steps + 1, dtype=torch.float64)
    paper = d_model**-0.5 * torch.minimum(step**-0.5, step * warmup**-1.5)  # section 5.3, steps from 1
    peak = (d_model * warmup) ** -0.5
    ours = {
        kind: [peak * lr_multiplier(kind, warmup, steps)(s) for s in range(steps)]
        for kind in ("inverse_sqrt", "cosine", "linear")
    }
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(step.numpy(), paper.numpy(), color="black", linewidth=4, alpha=0.3, label="the paper's formula")
    styles = {"inverse_sqrt": "-", "cosine": "--", "linear": ":"}
    for kind, values in ours.items():
        ax.plot(step.numpy(), values, styles[kind], label=f'lr_multiplier("{kind}") x {peak:.2e}')
    ax.set(
        xlabel="optimizer step",
        ylabel="learning rate",
        title=f"Warm-up then decay: d_model = {d_model}, warmup_steps = {warmup}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/figures", help="folder for the PNGs (default: docs/figures)")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in (
        ("paper_positions.png", positions_figure),
        ("paper_masks.png", masks_figure),
        ("paper_schedule.png", schedule_figure),
    ):
        draw(out / name)
        print(out / name)


if __name__ == "__main__":
    main()
