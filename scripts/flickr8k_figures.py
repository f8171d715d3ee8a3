"""The Flickr8k figures of the captioning guide (docs/guides/captioning.md): dev photographs with the
model's captions and their references, and one photo's word-by-word cross-attention over its 7 x 7 regions.

    python scripts/flickr8k_figures.py --checkpoint runs/flickr8k/best --flickr8k ../shared/data/flickr8k
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scratchformer.data.caption_corpora import load_flickr8k
from scratchformer.tasks.captioning import load_captioner, plot_caption_examples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="runs/flickr8k/best")
    parser.add_argument("--flickr8k", default="../shared/data/flickr8k")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--out-dir", default="docs/figures")
    parser.add_argument("--first", type=int, default=0, help="index of the first photo shown (split order)")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument(
        "--attention", type=int, default=0, help="which of the shown photos gets the attention figure"
    )
    parser.add_argument("--beam", type=int, default=None, help="default: the recipe's")
    args = parser.parse_args()

    captioner = load_captioner(args.checkpoint, device="cpu")
    corpus = load_flickr8k(args.flickr8k, args.split)
    names = corpus.names[args.first : args.first + args.count]
    references = corpus.references[args.first : args.first + args.count]
    features, photos = captioner.photo_features([corpus.image_dir / n for n in names])
    hypotheses = captioner.caption(features, beam_size=args.beam)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    beam = args.beam or captioner.decoding.get("beam_size", 3)
    plot_caption_examples(
        photos,
        hypotheses,
        references,
        out / "flickr8k_dev.png",
        f"Flickr8k {args.split} photos {args.first}-{args.first + len(names) - 1}, beam {beam}",
    )
    for name, hyp in zip(names, hypotheses):
        print(f"{name}\t{hyp}")
    with torch.no_grad():
        words = captioner.plot_attention(
            features[args.attention], out / "flickr8k_attention.png", photo=photos[args.attention]
        )
    print(f"{out / 'flickr8k_attention.png'} ({names[args.attention]}): {' '.join(words)}")


if __name__ == "__main__":
    main()
