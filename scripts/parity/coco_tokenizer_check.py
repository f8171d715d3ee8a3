"""How much our Python tokenisation moves the COCO caption metrics: the same captions scored with
``caption_words`` (what scratchformer reports) and with pycocoevalcap's own PTBTokenizer (Stanford
CoreNLP, needs Java), BLEU-1..4 and CIDEr-D side by side.

    python scripts/parity/coco_tokenizer_check.py --captions runs/flickr8k/valid_captions.txt \
        --flickr8k ../shared/data/flickr8k --split dev
"""

from __future__ import annotations

import argparse
import json

from scratchformer.data.caption_corpora import load_flickr8k
from scratchformer.tasks.captioning import caption_scores


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--captions", required=True, help="one caption per line, in the split's order")
    parser.add_argument("--flickr8k", default="../shared/data/flickr8k")
    parser.add_argument("--split", default="dev")
    args = parser.parse_args()

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    corpus = load_flickr8k(args.flickr8k, args.split)
    hypotheses = open(args.captions, encoding="utf-8").read().splitlines()
    if len(hypotheses) != len(corpus):
        raise SystemExit(f"error: {len(hypotheses)} captions for {len(corpus)} images")
    ours = caption_scores(hypotheses, corpus.references)
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(corpus.references)})
    res = tokenizer.tokenize({i: [{"caption": h}] for i, h in enumerate(hypotheses)})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    ptb = {**{f"bleu{n}": 100 * b for n, b in enumerate(bleu, 1)}, "cider": 100 * cider}
    for key in ("bleu1", "bleu2", "bleu3", "bleu4", "cider"):
        print(
            json.dumps(
                {
                    "metric": key,
                    "caption_words": round(ours[key], 2),
                    "ptb_java": round(ptb[key], 2),
                    "difference": round(ours[key] - ptb[key], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
