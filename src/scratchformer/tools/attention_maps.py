"""Look at attention: record the probabilities every MultiHeadAttention computes, and draw them.

    with record_attention(model) as recorded:
        model(src, tgt)
    recorded["decoder.layers.0.cross_attn"]   # list of (B, H, T, S) tensors, one per call
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from scratchformer.tasks.translation import Translator

from scratchformer.core.attention import MultiHeadAttention

__all__ = ["plot_attention", "record_attention", "translation_attention_maps"]


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


def translation_attention_maps(
    translator: Translator, text: str, out_dir: str | Path, beam_size: int = 5
) -> tuple[str, list[Path]]:
    """Translate ``text``, then draw every attention module's weights for that sentence pair:
    encoder self-attention (source x source), decoder self-attention (target x target prefix) and
    cross-attention (target x source), one PNG per layer and kind. Returns (translation, paths)."""
    from scratchformer.tasks.translation import BOS, pad_ids

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    translation = translator.translate([text], beam_size=beam_size)[0]
    src_ids = translator.encode_sources([text])[0]
    tgt_ids = translator.tokenizer.encode(translation).ids

    def label(i: int) -> str:  # byte-level pieces, decoded one by one; "▁" marks a word start
        return translator.tokenizer.decode([i], skip_special_tokens=False).replace(" ", "▁") or "<eos>"

    source = [label(i) for i in src_ids[:-1]] + ["</s>"]
    predicted = [label(i) for i in tgt_ids] + ["</s>"]
    prefix = ["<s>"] + [label(i) for i in tgt_ids]
    with torch.no_grad(), record_attention(translator.model) as recorded:
        translator.model(pad_ids([src_ids]), pad_ids([[BOS] + tgt_ids]))
    written = []
    for name, calls in recorded.items():  # e.g. "decoder.layers.2.cross_attn"
        stack, _, layer, kind = name.split(".")
        rows, cols = (source, source) if stack == "encoder" else (predicted, source if kind == "cross_attn" else prefix)
        path = out / f"{stack}-layer{layer}-{kind}.png"
        plot_attention(calls[0][0], rows, cols, path, f"{name}  (rows: {'queries' if stack == 'encoder' else 'predicted'})")
        written.append(path)
    return translation, written
