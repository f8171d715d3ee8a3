"""Copy a BERT encoder directory, filling its untrained learned positions with the trained ones.

    python scripts/experiments/copy_trained_positions.py runs/imdb_mlm_8000/encoder runs/exp_poscopy/encoder

``scratchformer train mlm`` trains positions 0..max_length-1 only (its tokenizer_config.json records
that length as ``model_max_length``); rows past it keep their random initialisation. This writes a
copy whose rows P..L-1 repeat rows 0..P-1 (P trained, L the table's length), as Longformer
initialised its longer table (Beltagy et al. 2020). An experiment: the pretraining guide
(docs/guides/pretraining.md) measures it on IMDB.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

KEY = "bert.embeddings.position_embeddings.weight"  # (L, D) in the BertForMaskedLM export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source", type=Path, help="an exported encoder directory (config.json, model.safetensors, ...)"
    )
    parser.add_argument("target", type=Path, help="a new directory")
    parser.add_argument(
        "--trained", type=int, help="trained positions P (default: model_max_length of tokenizer_config.json)"
    )
    args = parser.parse_args()
    if args.target.exists():
        raise SystemExit(f"{args.target} exists: give a new directory")
    weights = args.source / "model.safetensors"
    if not weights.is_file():
        raise SystemExit(f"{weights}: not found (give an exported encoder directory)")
    state = load_file(str(weights))
    if KEY not in state:
        raise SystemExit(f"{weights}: no {KEY} (learned positions of a BERT export)")
    table = state[KEY]
    trained = args.trained
    if trained is None:
        settings = args.source / "tokenizer_config.json"
        trained = json.loads(settings.read_text()).get("model_max_length") if settings.is_file() else None
        if not isinstance(trained, int):
            raise SystemExit(f"{settings}: no model_max_length to read: give --trained P")
    if not 0 < trained < len(table):
        raise SystemExit(
            f"--trained must be in [1, {len(table) - 1}] (the table has {len(table)} rows), got {trained}"
        )
    table = table.clone()
    for start in range(trained, len(table), trained):
        rows = min(trained, len(table) - start)
        table[start : start + rows] = table[:rows]
    state[KEY] = table
    shutil.copytree(args.source, args.target)
    save_file(state, str(args.target / "model.safetensors"), metadata={"format": "pt"})
    print(f"rows {trained}..{len(table) - 1} of {KEY} now repeat rows 0..{trained - 1} -> {args.target}")


if __name__ == "__main__":
    main()
