"""Look at attention: record the probabilities every MultiHeadAttention computes, and draw them.

    with record_attention(model) as recorded:
        model(src, tgt)
    recorded["decoder.layers.0.cross_attn"]   # list of (B, H, T, S) tensors, one per call
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from torch import Tensor, nn

from scratchformer.attention import MultiHeadAttention

__all__ = ["plot_attention", "record_attention"]


@contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Within the block, every attention module of ``model`` keeps its (B, H, T, S) weights
    (computed with the explicit kernel). Yields {module name: [weights of each call]}."""
    modules = {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    recorded: dict[str, list[Tensor]] = {}
    for name, m in modules.items():
        m.record_weights, m.recorded = True, []
        recorded[name] = m.recorded
    try:
        yield recorded
    finally:
        for m in modules.values():
            m.record_weights = False
            m.recorded = []


def plot_attention(weights: Tensor, queries: Sequence[str], keys: Sequence[str], path: str | Path, title: str) -> None:
    """One heatmap per head: weights (H, T, S), rows = ``queries`` (T), columns = ``keys`` (S)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.shape[0]
    cols = min(4, heads)
    rows = (heads + cols - 1) // cols
    size = 0.28 * max(len(keys), len(queries)) + 1.5
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[h].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)), queries, fontsize=7)
        ax.set_title(f"head {h}", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
