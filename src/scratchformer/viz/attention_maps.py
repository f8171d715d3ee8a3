"""Look at attention: record the probabilities every MultiHeadAttention computes, and draw them.
Imports core/ only.

Usage::

    with record_attention(model) as recorded:
        model(src, tgt)
    recorded["decoder.layers.0.cross_attn"]   # list of (B, H, T, S) tensors, one per call
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from scratchformer.core.attention import MultiHeadAttention

__all__ = ["plot_attention", "record_attention"]


@contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Within the block, every attention module of ``model`` also returns and keeps its (B, H, T, S)
    weights (the explicit kernel computes them). Yields {module name: [weights of each call]}.

    Forward hooks do it from outside: a pre-hook asks each module for ``need_weights=True``, a hook
    keeps them (and hands the caller None where it had not asked). Nothing inside the module changes.
    """
    recorders = {name: _Recorder() for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    modules = dict(model.named_modules())
    handles = [
        hook
        for name, rec in recorders.items()
        for hook in (
            modules[name].register_forward_pre_hook(rec.before, with_kwargs=True),
            modules[name].register_forward_hook(rec.after),
        )
    ]
    try:
        yield {name: rec.calls for name, rec in recorders.items()}
    finally:
        for handle in handles:
            handle.remove()


class _Recorder:
    """The two hooks of one attention module, and the weights of each of its calls."""

    def __init__(self) -> None:
        self.calls: list[Tensor] = []
        self._asked: list[bool] = []  # whether each call's caller wanted the weights itself

    def before(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        self._asked.append(bool(kwargs.get("need_weights", False)))
        return args, {**kwargs, "need_weights": True}

    def after(
        self, module: nn.Module, args: tuple[Any, ...], output: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor | None]:
        out, weights = output
        self.calls.append(weights.detach())
        return out, weights if self._asked.pop() else None


def plot_attention(
    weights: Tensor, queries: Sequence[str], keys: Sequence[str], path: str | Path, title: str
) -> None:
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
