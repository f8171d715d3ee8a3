"""Export a translation checkpoint to CTranslate2 and measure how often the engine (float32 and int8)
gives the same translation as our Translator, greedy and with the checkpoint's beam, and the BLEU of
each, on a test set.

    python scripts/parity/ct2_parity.py runs/multi30k/averaged [--limit 100] [--threads 2]

Prints one JSON object: the identical-line fractions (float32 greedy and beam, int8 greedy and
beam) and the same up to ties (``up_to_ties``: a differing line counts when our model scores both
translations within 1e-4, the beam's length-normalised log-probability; each differing line carries
both scores), corpus BLEU / chrF of ours, CTranslate2 float32 and int8 (sacreBLEU, as ``scratchformer
evaluate``), the seconds each took in this run, and every line where float32 differs from ours
(int8: the first ``--show``). CTranslate2 decodes with ``ctranslate2_options``, in the batches our
Translator makes (sorted by length, 64 at a time; each batch's own ``a * S + b`` limit).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scratchformer.data.parallel_texts import load_parallel_texts  # noqa: E402
from scratchformer.data.tokenization import save_hf_tokenizer  # noqa: E402
from scratchformer.formats.ctranslate2_export import translate_like_ours, write_ctranslate2  # noqa: E402
from scratchformer.generation.scoring import TieReport  # noqa: E402
from scratchformer.tasks.translation import Translator, bleu_and_chrf, load_translator  # noqa: E402
from scratchformer.tasks.translation.ties import same_translations_up_to_ties  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "multi30k"


def export(translator: Translator, directory: Path) -> Path:
    """The float32 CTranslate2 folder of ``translator``, with its Hugging Face tokenizer files."""
    tokenizer, max_len = translator.tokenizer, translator.model.config.max_len

    def tokenizer_files(folder: Path) -> None:
        if hasattr(tokenizer, "target_vocab"):  # a Marian tokenizer: its sentencepiece files
            tokenizer.save(folder)
        else:
            save_hf_tokenizer(tokenizer, folder, max_len, eos=translator.eos)

    return write_ctranslate2(
        translator.model,
        tokenizer,
        translator.special_ids,
        directory,
        tokenizer_files=tokenizer_files,
        decoding=translator.decoding,
    )


def ct2_translations(
    directory: Path, translator: Translator, sources: list[str], beam: int, compute_type: str, threads: int
) -> tuple[list[str], float]:
    """CTranslate2's translations of ``sources`` and the seconds they took (tokenisation included)."""
    import ctranslate2
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    engine = ctranslate2.Translator(
        str(directory), device="cpu", compute_type=compute_type, intra_threads=threads
    )
    start = time.perf_counter()
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer.encode(s)) for s in sources]
    best = translate_like_ours(engine, tokens, translator.decoding, translator.model.config.max_len, beam)
    texts = [tokenizer.decode(tokenizer.convert_tokens_to_ids(h), skip_special_tokens=True) for h in best]
    return texts, time.perf_counter() - start


def scored(ties: TieReport, line: int) -> dict[str, Any]:
    """A differing line's two scores by our model and whether they tie (texts that tokenise the
    same: tied, unscored)."""
    found = [d for d in ties.tied + ties.different if d.line == line]
    if not found:
        return {"tied": True}
    d = found[0]
    return {
        "tied": d.gap <= ties.tolerance,
        "ours_score": round(d.ours_score, 6),
        "ct2_score": round(d.theirs_score, 6),
    }


def parity(
    translator: Translator, sources: list[str], references: list[str], threads: int = 1, show: int = 20
) -> dict[str, Any]:
    """The report (see the module's docstring) for ``translator`` on ``sources``."""
    beam = int(translator.decoding.get("beam_size", 5))
    report: dict[str, Any] = {"n": len(sources), "beam_size": beam, "decoding": translator.decoding}
    for key in ("identical", "up_to_ties", "bleu", "chrf", "seconds", "differing"):
        report[key] = {}

    def record(name: str, texts: list[str], seconds: float) -> None:
        scores = bleu_and_chrf(texts, references)
        report["bleu"][name], report["chrf"][name] = round(scores["bleu"], 2), round(scores["chrf"], 2)
        report["seconds"][name], report["bleu_signature"] = round(seconds, 2), scores["bleu_signature"]

    with tempfile.TemporaryDirectory() as tmp:
        directory = export(translator, Path(tmp) / "ct2")
        for search, size in (("greedy", 1), ("beam", beam)):
            start = time.perf_counter()
            ours = translator.translate(sources, beam_size=size)
            record(f"ours_{search}", ours, time.perf_counter() - start)
            for compute_type, limit in (("float32", None), ("int8", show)):
                theirs, seconds = ct2_translations(
                    directory, translator, sources, size, compute_type, threads
                )
                name = f"{compute_type}_{search}"
                record(f"ct2_{name}", theirs, seconds)
                ties = same_translations_up_to_ties(translator, sources, ours, theirs)
                differ = [
                    {"line": i + 1, "source": s, "ours": o, "ct2": t, **scored(ties, i)}
                    for i, (s, o, t) in enumerate(zip(sources, ours, theirs))
                    if o != t
                ]
                report["identical"][name] = round(1 - len(differ) / len(sources), 4)
                report["up_to_ties"][name] = round(ties.share, 4)
                report["differing"][name] = differ[:limit]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a translation checkpoint directory (ours, or a Marian one)")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.de.gz"))
    parser.add_argument("--reference", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--limit", type=int, default=None, help="the first N lines only")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of both engines")
    parser.add_argument("--show", type=int, default=20, help="int8's differing lines printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = load_parallel_texts(args.source, args.reference, limit=args.limit)
    translator = load_translator(args.checkpoint, device="cpu")
    report = parity(translator, list(texts.sources), list(texts.targets), args.threads, args.show)
    print(
        json.dumps(
            {"checkpoint": args.checkpoint, "threads": args.threads, **report}, indent=2, ensure_ascii=False
        )
    )


if __name__ == "__main__":
    main()
