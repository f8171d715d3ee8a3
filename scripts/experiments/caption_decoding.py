"""Choose a captioner's decoding on the dev split, as a recipe's ``decoding_grid`` does after training
(:func:`~scratchformer.tasks.captioning.captioner.choose_decoding`): every combination of the options
given is scored (BLEU-1..4, CIDEr-D with pycocoevalcap); one JSON line each, then a Markdown table,
best CIDEr-D first, and the winner.

    python scripts/experiments/caption_decoding.py --checkpoint runs/flickr8k/scst/best \\
        --features runs/features/flickr8k-efficientnet-lite2.safetensors \\
        --grid beam_size=1,3,5 --grid length_penalty=0.5,1.0 --grid no_repeat_ngram_size=0,3

Repeat ``--checkpoint`` to choose an ensemble's decoding. ``--grid KEY=V1,V2`` takes a recipe
``decoding`` key (beam_size, length_penalty, no_repeat_ngram_size, min_new_tokens); the checkpoint's
decoding fills the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scratchformer.data.caption_corpora import load_flickr8k
from scratchformer.data.captions import CaptionExamples
from scratchformer.tasks.captioning.captioner import choose_decoding
from scratchformer.tasks.captioning.ensemble import load_ensemble
from scratchformer.tasks.shared import CAPTIONING_DECODING, check_decoding_grid


def parse_grid(items: list[str]) -> dict[str, list[float | int]]:
    grid = {}
    for item in items:
        name, _, values = item.partition("=")
        if not name or not values:
            raise SystemExit(f"--grid {item!r}: expected KEY=V1,V2,...")
        grid[name] = [int(v) if v.lstrip("-").isdigit() else float(v) for v in values.split(",")]
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", action="append", required=True, help="repeat for an ensemble")
    parser.add_argument("--flickr8k", default="../shared/data/flickr8k")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--features", help="the photos' feature file (reused; extracted into if missing)")
    parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeatable)")
    parser.add_argument("--out", help="also write the JSON lines here")
    args = parser.parse_args()

    captioner = load_ensemble(args.checkpoint, device="cpu")
    grid = parse_grid(args.grid)
    check_decoding_grid(captioner.decoding, grid, CAPTIONING_DECODING)
    corpus = load_flickr8k(args.flickr8k, args.split)
    examples = CaptionExamples(captioner.corpus_features(corpus, args.features), corpus.references)
    start = time.perf_counter()
    chosen, trials = choose_decoding(captioner, examples, grid)
    rows = [{k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()} for t in trials]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = [*grid, "bleu1", "bleu2", "bleu3", "bleu4", "cider", "words"]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in sorted(rows, key=lambda r: -r["cider"]):
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    print(
        f"{args.split}, {len(corpus)} photos, {' + '.join(args.checkpoint)}: chosen {json.dumps(chosen)} "
        f"({len(rows)} combinations in {time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
