"""The fast beam search against the readable one on a whole test split: the lines they translate the
same (identical, or tied: our model scores both within 1e-4), the lines they do not, and the time
each took, in one process, interleaved by batch::

    python scripts/parity/fast_beam_parity.py --checkpoint runs/multi30k/best \\
        --source ../shared/data/multi30k/test_2016_flickr.de.gz

Prints one JSON line (``--out FILE`` also writes it there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path


def compare(checkpoint: str, source: str, batch_size: int = 32, limit: int | None = None) -> dict:
    """Translate ``source``'s lines with ``fast_beam_search`` and with ``beam_search`` (batches of
    ``batch_size``, alternating which runs first); the share of lines the same up to ties, the
    differing lines, and the seconds of each."""
    from scratchformer.data.labelled_texts import open_text
    from scratchformer.generation.fast_beam import readable_beam_search
    from scratchformer.tasks.translation import load_translator
    from scratchformer.tasks.translation.ties import same_translations_up_to_ties

    translator = load_translator(checkpoint, device="cpu")
    with open_text(source) as lines:
        texts = [line.strip() for line in lines][:limit]
    outputs: dict[str, list[str]] = {"fast": [], "reference": []}
    seconds = dict.fromkeys(outputs, 0.0)
    for i in range(0, len(texts), batch_size):
        order = ("fast", "reference") if (i // batch_size) % 2 == 0 else ("reference", "fast")
        for name in order:
            with readable_beam_search() if name == "reference" else contextlib.nullcontext():
                start = time.perf_counter()
                outputs[name] += translator.translate(texts[i : i + batch_size], batch_size=batch_size)
                seconds[name] += time.perf_counter() - start
    report = same_translations_up_to_ties(translator, texts, outputs["reference"], outputs["fast"])
    return {
        "lines": len(texts),
        "same_up_to_ties": report.share,
        "identical": sum(a == b for a, b in zip(outputs["reference"], outputs["fast"])) / len(texts),
        "tied": len(report.tied),
        "different": [d.index for d in report.different],
        "seconds_fast": round(seconds["fast"], 2),
        "seconds_reference": round(seconds["reference"], 2),
        "speed_up": round(seconds["reference"] / seconds["fast"], 2),
        "batch_size": batch_size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a translation checkpoint directory")
    parser.add_argument("--source", required=True, help="source lines (.gz read as gzip)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None, help="the first N lines only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args(argv)
    if not Path(args.checkpoint).is_dir() or not Path(args.source).is_file():
        parser.error(f"no checkpoint folder {args.checkpoint} or no source file {args.source}")
    import torch

    torch.set_num_threads(args.threads)
    line = json.dumps(compare(args.checkpoint, args.source, args.batch_size, args.limit))
    print(line)
    if args.out is not None:
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
