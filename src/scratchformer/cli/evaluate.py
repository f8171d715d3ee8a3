"""``scratchformer evaluate``: score a checkpoint on a test set, by the kind of model it holds: a
classifier (accuracy, F1), a translator (BLEU, chrF) or a captioner (BLEU-1..4, CIDEr-D)."""

from __future__ import annotations

import argparse
import sys

from scratchformer.cli.options import (
    add_generation_options,
    generation_options,
    positive,
    precision_autocast,
)
from scratchformer.cli.paths import refuse_output_over_input, require_checkpoint

__all__ = ["add_evaluate"]


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    evaluate = sub.add_parser(
        "evaluate",
        help="score a checkpoint: a classifier (accuracy, F1), a translator (BLEU, chrF) "
        "or a captioner (BLEU-1..4, CIDEr-D, exact match)",
    )
    evaluate.add_argument(
        "--checkpoint",
        required=True,
        action="append",
        help="our checkpoint, or its Hugging Face export (Marian; BertForSequenceClassification, "
        "any such directory too); translation and captioning: repeat it to evaluate an ensemble (mean "
        "log-probabilities)",
    )
    evaluate.add_argument("--data", help="classifier: JSONL/CSV file with text and label")
    evaluate.add_argument("--source", help="translation: source sentences, one per line (.gz ok)")
    evaluate.add_argument("--reference", help="translation: reference translations, one per line")
    evaluate.add_argument("--captions", help="captioning: captions TSV (image_id<TAB>caption)")
    evaluate.add_argument(
        "--images",
        help="captioning: the folder of images or feature files (with --captions), "
        "or of the photos of --karpathy",
    )
    evaluate.add_argument(
        "--flickr8k", help="captioning: a Flickr8k folder (Images/, captions.txt, split lists)"
    )
    evaluate.add_argument("--karpathy", help="captioning: a Karpathy split JSON (dataset_coco.json, ...)")
    evaluate.add_argument(
        "--split", help="captioning: the split of --flickr8k (default dev) or --karpathy (default test)"
    )
    evaluate.add_argument(
        "--features",
        help="captioning, a photo model: image features file to reuse (extracted into it if missing)",
    )
    add_generation_options(evaluate)
    evaluate.add_argument(
        "--output",
        help="translation/captioning: write the hypotheses here (never over a file it reads)",
    )
    evaluate.add_argument("--text-field", default="text")
    evaluate.add_argument("--label-field", default="label")
    evaluate.add_argument("--batch-size", type=positive, default=64, help="examples per batch")
    evaluate.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (CPU or GPU)"
    )
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument(
        "--meteor", action="store_true", help="captioning: METEOR too (pycocoevalcap's jar; needs Java)"
    )
    evaluate.add_argument("--json", action="store_true", help="the scores as one JSON object")
    evaluate.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    _refuse_outputs_over_inputs(args)
    for checkpoint in args.checkpoint:
        require_checkpoint(checkpoint)  # a missing path: named before torch is imported
    from scratchformer.tasks.shared.kinds import checkpoint_kind

    kinds = [checkpoint_kind(c) for c in args.checkpoint]
    kind = kinds[0]
    if len(kinds) > 1 and (len(set(kinds)) > 1 or kind not in ("captioning", "translation")):
        raise ValueError(
            "several --checkpoint: translation or captioning models of one kind decode as an ensemble, "
            f"got {', '.join(kinds)}"
        )
    if kind not in ("captioning", "translation"):
        args.checkpoint = args.checkpoint[0]
    args.generation = generation_options(args)
    if kind not in ("translation", "captioning") and (args.generation or args.prefix):
        raise ValueError(
            f"decoding flags ({', '.join(sorted(args.generation))}) apply to translation and "
            "captioning models, not to a classifier"
        )
    if args.meteor and kind != "captioning":
        raise ValueError("--meteor scores captions; this checkpoint is not a captioning model")
    if kind == "translation":
        return _evaluate_translation(args)
    if kind == "captioning":
        return _evaluate_captioning(args)
    return _evaluate_classifier(args)


_INPUTS = ("checkpoint", "data", "source", "reference", "captions", "images", "flickr8k", "karpathy")


def _refuse_outputs_over_inputs(args: argparse.Namespace) -> None:
    """``--output`` (the hypotheses) and ``--features`` (written when photos are missing from it) must
    not be, or link to, a file the command reads, nor an existing file in a folder it reads."""
    inputs = {f"--{name}": getattr(args, name) for name in _INPUTS}
    refuse_output_over_input({"--output": args.output}, {**inputs, "--features": args.features})
    files = {
        flag: path for flag, path in inputs.items() if flag not in ("--checkpoint", "--images", "--flickr8k")
    }
    refuse_output_over_input({"--features": args.features}, files)


def _evaluate_classifier(args: argparse.Namespace) -> int:
    import json

    from scratchformer.data.labelled_texts import load_labelled_texts
    from scratchformer.tasks.classification import load_classifier

    if not args.data:
        raise ValueError("--data FILE is required to evaluate a classifier")
    clf = load_classifier(args.checkpoint, device=args.device)
    data = load_labelled_texts(args.data, args.text_field, args.label_field, clf.label_names)
    metrics = clf.evaluate(data, batch_size=args.batch_size, precision=args.precision)
    if data.skipped:
        print(f"skipped: {data.skipped}", file=sys.stderr)
    if args.json:
        print(json.dumps(metrics))
    else:
        _print_classification_report(metrics)
    return 0


def _print_classification_report(metrics: dict) -> None:
    print(
        f"accuracy {metrics['accuracy']:.4f}   macro F1 {metrics['macro_f1']:.4f}   ({metrics['n']} examples)"
    )
    print(f"{'class':<16}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for name, m in metrics["per_class"].items():
        print(f"{name:<16}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{m['support']:>10}")
    names = list(metrics["per_class"])
    print("confusion matrix (rows: true, columns: predicted)")
    print(" " * 16 + "".join(f"{n[:10]:>12}" for n in names))
    for name, row in zip(names, metrics["confusion"]):
        print(f"{name:<16}" + "".join(f"{v:>12}" for v in row))


def _evaluate_translation(args: argparse.Namespace) -> int:
    from scratchformer.data.labelled_texts import open_text
    from scratchformer.tasks.translation import load_translator

    if not (args.source and args.reference):
        raise ValueError("--source FILE and --reference FILE are required to evaluate a translation model")
    with open_text(args.source) as f:  # lines as training and the recipe's test read them (strip)
        sources = [line.strip() for line in f]
    with open_text(args.reference) as f:
        references = [line.strip() for line in f]
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} source lines but {len(references)} reference lines")
    translator = load_translator(args.checkpoint, device=args.device)
    with precision_autocast(translator.device, args.precision):
        scores = translator.evaluate(
            sources,
            references,
            config=translator.generation_config(**args.generation),
            prefix=args.prefix,
            seed=args.seed,
            batch_size=args.batch_size,
        )
    return _print_scores(args, scores, "BLEU {bleu:.2f}  chrF {chrf:.2f}  ({n} sentences; {bleu_signature})")


def _evaluate_captioning(args: argparse.Namespace) -> int:
    from scratchformer.data.caption_metrics import check_meteor
    from scratchformer.tasks.captioning.ensemble import load_ensemble

    if not (args.flickr8k or args.karpathy or (args.captions and args.images)):
        raise ValueError(
            "a captioning model is evaluated on --flickr8k DIR, --karpathy JSON --images DIR, "
            "or --captions TSV --images DIR"
        )
    if args.karpathy and not args.images:
        raise ValueError("--karpathy JSON needs --images DIR (the folder its file paths are under)")
    if args.meteor:
        check_meteor()
    captioner = load_ensemble(args.checkpoint, device=args.device)
    if args.features and captioner.photos is None:
        raise ValueError(
            "--features: this model was not trained on photographs through the image encoder; it reads "
            + ("the images themselves" if captioner.model.config.input == "pixels" else "the feature files")
        )
    examples = _caption_examples(args, captioner)
    with precision_autocast(captioner.device, args.precision):
        scores = captioner.evaluate(
            examples,
            config=captioner.generation_config(**args.generation),
            prefix=args.prefix,
            seed=args.seed,
            batch_size=args.batch_size,
            meteor=args.meteor,
        )
    return _print_scores(
        args,
        scores,
        "BLEU-1 {bleu1:.2f}  BLEU-2 {bleu2:.2f}  BLEU-3 {bleu3:.2f}  BLEU-4 {bleu4:.2f}  "
        + ("METEOR {meteor:.2f}  " if args.meteor else "")
        + "CIDEr-D {cider:.2f}  exact match {exact_match:.1%}  ({n} images)",
    )


def _caption_examples(args: argparse.Namespace, captioner):
    """The test images with their references, as the model reads them, from any form training takes:
    a photo model's photographs (Flickr8k, Karpathy JSON or a captions TSV) through its image encoder
    (``--features``: reused or extracted into), else a captions TSV's images or feature files."""
    from pathlib import Path

    from scratchformer.data.caption_corpora import CaptionCorpus, load_flickr8k, load_karpathy_json
    from scratchformer.data.captions import (
        CaptionExamples,
        find_caption_file,
        load_caption_folder,
        read_captions_tsv,
    )

    if args.flickr8k or args.karpathy:
        corpus = (
            load_flickr8k(args.flickr8k, args.split or "dev")
            if args.flickr8k
            else load_karpathy_json(args.karpathy, args.images, args.split or "test")
        )
        print(corpus.report(), file=sys.stderr)
    elif captioner.photos is not None:  # a photo model: the TSV names photographs, encoded as in training
        references, folder = read_captions_tsv(args.captions), Path(args.images)
        names = [find_caption_file(folder, i).relative_to(folder).as_posix() for i in references]
        corpus = CaptionCorpus(folder, names, list(references.values()))
    else:
        config = captioner.model.config
        return load_caption_folder(
            args.captions, args.images, config.image_size if config.input == "pixels" else None
        )[0]
    return CaptionExamples(captioner.corpus_features(corpus, args.features), corpus.references)


def _print_scores(args: argparse.Namespace, scores: dict, line: str) -> int:
    """Write the hypotheses to ``--output`` (if given); print the scores as JSON or as ``line``."""
    import json

    hypotheses = scores.pop("hypotheses")
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(hypotheses) + "\n")
    print(json.dumps(scores) if args.json else line.format(**scores))
    return 0
