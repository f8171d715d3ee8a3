"""Translation models alone, as an ensemble, and averaged weight by weight, on one test set: the
Multi30k guide's ensemble table.

    python scripts/experiments/translation_ensemble.py --checkpoint runs/multi30k/averaged \
        --checkpoint runs/multi30k_seed1/averaged \
        --source ../shared/data/multi30k/test_2016_flickr.de.gz \
        --reference ../shared/data/multi30k/test_2016_flickr.en.gz

Prints one Markdown row per system: sacreBLEU, chrF, the decoding time. Every system decodes with
the first checkpoint's decoding settings (its recipe's, e.g. beam 5). The weight average of
independently trained models is shown because people ask for it; it needs one architecture and
one tokenizer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ beside src/
from benchmarks.report import machine_description  # noqa: E402
from scratchformer.data.labelled_texts import open_text  # noqa: E402
from scratchformer.tasks.translation import Translator, load_translator  # noqa: E402
from scratchformer.training.checkpoint import average_checkpoints  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", action="append", required=True, help="repeat: two or more")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if len(args.checkpoint) < 2:
        parser.error("give --checkpoint at least twice")
    with open_text(args.source) as f:
        sources = [line.strip() for line in f]
    with open_text(args.reference) as f:
        references = [line.strip() for line in f]
    singles = [load_translator(c, device="cpu") for c in args.checkpoint]
    config = singles[0].generation_config()
    systems: list[tuple[str, Translator]] = [(f"`{c}`", t) for c, t in zip(args.checkpoint, singles)]
    systems.append(
        (f"ensemble of the {len(singles)} (`--checkpoint` x {len(singles)})", Translator.ensemble(singles))
    )
    averaged = load_translator(args.checkpoint[0], device="cpu")
    average_checkpoints([Path(c) for c in args.checkpoint], averaged.model)
    systems.append((f"weights of the {len(singles)} averaged", averaged))
    print(f"machine: {machine_description(torch.device('cpu'))}")
    print(
        f"decoding (the first checkpoint's): {config.num_beams} beams, length penalty {config.length_penalty}"
    )
    print("| system | test BLEU | chrF | decoding time |")
    print("|---|---|---|---|")
    for name, translator in systems:
        start = time.perf_counter()
        scores = translator.evaluate(sources, references, config=config, batch_size=args.batch_size)
        seconds = time.perf_counter() - start
        print(f"| {name} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {seconds:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
