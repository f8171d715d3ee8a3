"""The captioning guide's figures (docs/guides/captioning.md): a few rendered test scenes with the
model's captions and their references, and one scene's word-by-word cross-attention over the image.

    python scripts/figures/caption_examples.py --checkpoint runs/shapes/best --out-dir docs/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scratchformer.data.shapes import shape_scene_splits
from scratchformer.tasks.captioning import load_captioner, plot_caption_examples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default="runs/shapes/best")
    parser.add_argument("--out-dir", default="docs/figures")
    parser.add_argument("--count", type=int, default=4, help="images per split")
    parser.add_argument("--seed", type=int, default=0, help="the scenes' seed (the recipe's shapes.seed)")
    parser.add_argument("--beam", type=int, default=3)
    args = parser.parse_args()

    captioner = load_captioner(args.checkpoint, device="cpu")
    splits = shape_scene_splits(seed=args.seed, train_size=0, valid_size=0, test_size=args.count)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("test_seen", "test_heldout"):
        split = splits[name]
        hypotheses = captioner.caption(split.inputs, beam_size=args.beam)
        path = out / f"captioning_{name}.png"
        plot_caption_examples(split.inputs, hypotheses, split.references, path, f"{name}, beam {args.beam}")
        print(f"{path}: " + " | ".join(hypotheses))
    words = captioner.plot_attention(splits["test_seen"].inputs[0], out / "captioning_attention.png")
    print(f"{out / 'captioning_attention.png'}: {' '.join(words)}")


if __name__ == "__main__":
    main()
