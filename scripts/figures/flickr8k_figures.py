"""The Flickr8k figures of the captioning guide (docs/guides/captioning.md):

- ``flickr8k_dev.png``: the first dev photographs (not chosen) with the model's captions and references;
- ``flickr8k_attention.png``: the first one's word-by-word cross-attention over its regions;
- ``flickr8k_good_bad.png``: the three dev photos whose captions score best and the three that score
  worst (CIDEr-D of each caption against its five references), each with its caption's attention,
  word by word (the caption shown is the one decoded with the recipe's settings, read back by the
  model to record its attention).

    python scripts/figures/flickr8k_figures.py --checkpoint runs/flickr8k/scst/best \\
        --flickr8k ../shared/data/flickr8k --features runs/features/flickr8k-efficientnet-lite2.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scratchformer.data.caption_corpora import load_flickr8k
from scratchformer.data.caption_metrics import CiderD
from scratchformer.data.image_features import load_photo
from scratchformer.tasks.captioning import load_captioner, plot_caption_examples
from scratchformer.tasks.captioning.figures import plot_caption_attention_rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="runs/flickr8k/best")
    parser.add_argument("--flickr8k", default="../shared/data/flickr8k")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--features", help="the photos' feature file (reused; extracted into if missing)")
    parser.add_argument("--out-dir", default="docs/figures")
    parser.add_argument("--first", type=int, default=0, help="index of the first photo shown (split order)")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--each", type=int, default=3, help="photos in the good and in the bad group")
    parser.add_argument("--beam", type=int, default=None, help="default: the recipe's")
    args = parser.parse_args()

    captioner = load_captioner(args.checkpoint, device="cpu")
    corpus = load_flickr8k(args.flickr8k, args.split)
    features = captioner.corpus_features(corpus, args.features)
    hypotheses = captioner.caption(features, beam_size=args.beam)
    size = captioner.image_encoder().image_size
    grid = round(features.shape[1] ** 0.5)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    beam = args.beam or captioner.decoding.get("beam_size", 3)

    def photos(indices: list[int]) -> torch.Tensor:
        return torch.stack([load_photo(corpus.image_dir / corpus.names[i], size) for i in indices])

    first = list(range(args.first, args.first + args.count))
    plot_caption_examples(
        photos(first),
        [hypotheses[i] for i in first],
        [corpus.references[i] for i in first],
        out / "flickr8k_dev.png",
        f"Flickr8k {args.split} photos {first[0]}-{first[-1]}, beam {beam}",
    )
    with torch.no_grad():
        words = captioner.plot_attention(
            features[first[0]],
            out / "flickr8k_attention.png",
            photo=photos(first[:1])[0],
            caption=hypotheses[first[0]],
        )
    print(f"{out / 'flickr8k_attention.png'} ({corpus.names[first[0]]}): {' '.join(words)}")

    cider = CiderD(corpus.references)  # its mean is pycocoevalcap's corpus CIDEr-D on these references
    scores = [cider.score(h, i) * 100 for i, h in enumerate(hypotheses)]  # x100, as the tables
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen = ranked[: args.each] + ranked[-args.each :]
    rows = [captioner.caption_with_attention(features[i], caption=hypotheses[i]) for i in chosen]
    titles = [
        f"{'best' if n < args.each else 'worst'} {n % args.each + 1}: CIDEr-D {scores[i]:.0f}. "
        f'"{hypotheses[i]}" / reference: "{corpus.references[i][0]}"'
        for n, i in enumerate(chosen)
    ]
    plot_caption_attention_rows(
        list(photos(chosen)),
        [w for w, _ in rows],
        [a for _, a in rows],
        grid,
        titles,
        out / "flickr8k_good_bad.png",
    )
    print(f"{out / 'flickr8k_good_bad.png'}:")
    for n, i in enumerate(chosen):
        group = "best" if n < args.each else "worst"
        print(
            f"| {group} | {corpus.names[i]} | {scores[i]:.1f} | {hypotheses[i]} | {corpus.references[i][0]} |"
        )


if __name__ == "__main__":
    main()
