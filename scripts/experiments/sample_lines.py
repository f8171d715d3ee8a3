"""A seeded random sample of a JSONL file's lines (.gz ok), for a cheaper but reproducible measurement.

    python scripts/experiments/sample_lines.py ../shared/data/imdb/test.jsonl.gz \\
        /tmp/imdb_test_5000.jsonl.gz 5000 --seed 0

The sample keeps the file's order; the same seed picks the same lines.
"""

from __future__ import annotations

import argparse
import gzip
import random
from pathlib import Path

from scratchformer.data.labelled_texts import open_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open_text(args.source) as f:  # .gz or plain; a missing or binary file is named
        lines = [line for line in f if line.strip()]
    if not 0 < args.count <= len(lines):
        raise SystemExit(f"count must be in [1, {len(lines)}] (the lines of {args.source}), got {args.count}")
    keep = sorted(random.Random(args.seed).sample(range(len(lines)), args.count))
    gz = args.target.suffix == ".gz"
    with (
        gzip.open(args.target, "wt", encoding="utf-8")
        if gz
        else open(args.target, "w", encoding="utf-8") as f
    ):
        f.writelines(lines[i] for i in keep)
    print(f"{args.count} of {len(lines)} lines -> {args.target}")


if __name__ == "__main__":
    main()
