"""The captioning guide's old-and-new figure (docs/guides/captioning.md): the first dev photographs
(not chosen), each with the captions of two checkpoints (e.g. the recipe on frozen features and the
recipe with its encoder's top fine-tuned), their CIDEr-D against the photo's five references, and
one reference. Each checkpoint reads its own feature file (extracted into it if missing).

    python scripts/figures/caption_comparison.py \\
        --old runs/flickr8k/best --old-features runs/features/flickr8k-efficientnet-lite2.safetensors \\
        --new runs/flickr8k-finetune/best \\
        --new-features runs/features/flickr8k-efficientnet-lite2-top2.safetensors \\
        --flickr8k ../shared/data/flickr8k --out docs/figures/flickr8k_old_new.png
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scratchformer.data.caption_corpora import CaptionCorpus, load_flickr8k  # noqa: E402
from scratchformer.data.caption_metrics import CiderD  # noqa: E402
from scratchformer.data.image_features import load_photo  # noqa: E402
from scratchformer.tasks.captioning import load_captioner  # noqa: E402


def captions(checkpoint: str, features: str | None, corpus: CaptionCorpus, beam: int) -> list[str]:
    """The checkpoint's captions (beam ``beam``) of the corpus's photos."""
    captioner = load_captioner(checkpoint, device="cpu")
    return captioner.caption(captioner.corpus_features(corpus, features), beam_size=beam)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", required=True, help="the first checkpoint (e.g. runs/flickr8k/best)")
    parser.add_argument("--new", required=True, help="the second checkpoint")
    parser.add_argument("--old-features", help="the first checkpoint's feature file")
    parser.add_argument("--new-features", help="the second checkpoint's feature file")
    parser.add_argument("--labels", default="frozen encoder,top two stages fine-tuned")
    parser.add_argument("--flickr8k", default="../shared/data/flickr8k")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--out", default="docs/figures/flickr8k_old_new.png")
    args = parser.parse_args()

    corpus = load_flickr8k(args.flickr8k, args.split)
    shown = dataclasses.replace(
        corpus, names=corpus.names[: args.count], references=corpus.references[: args.count]
    )
    old = captions(args.old, args.old_features, shown, args.beam)  # only the photos shown are encoded
    new = captions(args.new, args.new_features, shown, args.beam)
    cider = CiderD(corpus.references)  # document frequencies of the whole split, as the tables'
    labels = args.labels.split(",")
    fig, axes = plt.subplots(1, args.count, figsize=(3.6 * args.count, 4.6), squeeze=False)
    for i, ax in enumerate(axes[0]):
        ax.imshow(load_photo(corpus.image_dir / corpus.names[i], 260).permute(1, 2, 0).numpy())
        ax.set_axis_off()
        lines = [
            f"{label}: {caption} ({100 * cider.score(caption, i):.0f})"
            for label, caption in zip(labels, (old[i], new[i]))
        ]
        lines.append(f"reference: {corpus.references[i][0]}")
        text = "\n".join(textwrap.fill(line, 38) for line in lines)
        ax.text(0, -0.04, text, transform=ax.transAxes, va="top", fontsize=8.5, family="sans-serif")
    title = f"Flickr8k {args.split}, the first {args.count} photos, beam {args.beam} (CIDEr-D in brackets)"
    fig.suptitle(title)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80, bbox_inches="tight")
    for label, caps in zip(labels, (old, new)):
        print(f"{label}: " + " | ".join(caps))
    print(args.out)


if __name__ == "__main__":
    main()
