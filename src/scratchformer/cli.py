"""The ``scratchformer`` command line, a thin layer over the Python API."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    import torch

    from scratchformer.demo import DemoConfig, run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = DemoConfig(task=args.task, steps=args.steps, seed=args.seed)
    result = run_demo(cfg, progress=not args.no_progress)
    print(f"\n{cfg.task} digits: greedy decoding of held-out inputs (KV cache)")
    for source, expected, predicted in result.examples:
        mark = "ok " if expected == predicted else "BAD"
        print(f"  {mark} {source:>12} -> {predicted:<12} (expected {expected})")
    print(
        f"exact-match accuracy {result.accuracy:.1%} on {cfg.eval_size} held-out inputs; "
        f"final loss {result.final_loss:.4f}; {result.seconds:.1f} s"
    )
    return 0


def _sentence_encoder(args: argparse.Namespace):
    from scratchformer.pretrained import SentenceEncoder, default_model_dir

    model = args.model or default_model_dir()
    if model is None:
        raise SystemExit(
            "error: --model DIR is required (or set SCRATCHFORMER_MODEL, or pip install -e '.[pretrained]')"
        )
    return SentenceEncoder.from_pretrained(model)


def _embed(args: argparse.Namespace) -> int:
    import json

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin]
    vectors = _sentence_encoder(args).encode(texts, batch_size=args.batch_size).tolist()
    if args.json:
        print(json.dumps([{"text": t, "embedding": v} for t, v in zip(texts, vectors)]))
    else:
        for vector in vectors:
            print(" ".join(f"{x:.6f}" for x in vector))
    return 0


def _similarity(args: argparse.Namespace) -> int:
    print(f"{_sentence_encoder(args).similarity(args.a, args.b):.4f}")
    return 0


def _train_classifier(args: argparse.Namespace) -> int:
    import json

    from scratchformer.data import default_data_dir
    from scratchformer.text_classification import ClassifierRecipe, train_classifier

    overrides: dict = {}
    if args.train:
        overrides["train_file"] = args.train
    if args.test:
        overrides["test_file"] = args.test
    train_overrides = {k: v for k, v in (("out_dir", args.out), ("epochs", args.epochs), ("max_steps", args.max_steps),
                                         ("precision", args.precision), ("threads", args.threads), ("device", args.device),
                                         ("seed", args.seed)) if v is not None}
    if args.config:
        recipe = ClassifierRecipe.from_json(args.config, train=train_overrides, **overrides)
    elif args.train:
        from scratchformer.training import TrainConfig

        recipe = ClassifierRecipe(**overrides, train=TrainConfig(**train_overrides))
    else:
        raise SystemExit("error: give --config RECIPE.json or --train FILE")
    report = train_classifier(recipe, args.data_dir or default_data_dir(), resume=args.resume)
    summary = {k: v for k, v in report.items() if k != "test"}
    if "test" in report:
        summary["test"] = {k: report["test"][k] for k in ("accuracy", "macro_f1", "n")}
    print(json.dumps(summary, indent=2))
    return 0


def _print_classification_report(metrics: dict) -> None:
    print(f"accuracy {metrics['accuracy']:.4f}   macro F1 {metrics['macro_f1']:.4f}   ({metrics['n']} examples)")
    print(f"{'class':<16}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}")
    for name, m in metrics["per_class"].items():
        print(f"{name:<16}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{m['support']:>10}")
    names = list(metrics["per_class"])
    print("confusion matrix (rows: true, columns: predicted)")
    print(" " * 16 + "".join(f"{n[:10]:>12}" for n in names))
    for name, row in zip(names, metrics["confusion"]):
        print(f"{name:<16}" + "".join(f"{v:>12}" for v in row))


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from scratchformer.data import load_labelled_texts
    from scratchformer.text_classification import load_classifier

    clf = load_classifier(args.checkpoint, device=args.device)
    data = load_labelled_texts(args.data, args.text_field, args.label_field, clf.label_names)
    metrics = clf.evaluate(data, batch_size=args.batch_size, precision=args.precision)
    if data.skipped:
        print(f"skipped: {data.skipped}", file=sys.stderr)
    if args.json:
        print(json.dumps(metrics, indent=2))
    else:
        _print_classification_report(metrics)
    return 0


def _classify(args: argparse.Namespace) -> int:
    from scratchformer.text_classification import load_classifier

    clf = load_classifier(args.checkpoint, device=args.device)
    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, (label, prob) in zip(texts, clf.predict(texts, batch_size=args.batch_size)):
        print(f"{label}\t{prob:.4f}\t{text}")
    return 0


def _add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="BERT-family checkpoint directory (config.json, model.safetensors, tokenizer.json); "
        "default $SCRATCHFORMER_MODEL, else all-MiniLM-L6-v2 from the 'pretrained' extra",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scratchformer",
        description="The Transformer of 'Attention Is All You Need', from scratch in PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a tiny encoder-decoder on a synthetic task (offline, < 1 min)")
    demo.add_argument("--task", choices=["reverse", "sort"], default="reverse")
    demo.add_argument("--steps", type=int, default=700, help="training steps (default 700)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(func=_demo)

    embed = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT-family checkpoint")
    _add_model_argument(embed)
    embed.add_argument("texts", nargs="*", help="texts to embed (default: one per line on stdin)")
    embed.add_argument("--json", action="store_true", help='print [{"text": ..., "embedding": [...]}, ...]')
    embed.add_argument("--batch-size", type=int, default=32)
    embed.set_defaults(func=_embed)

    similarity = sub.add_parser("similarity", help="cosine similarity of two texts' sentence embeddings")
    _add_model_argument(similarity)
    similarity.add_argument("a")
    similarity.add_argument("b")
    similarity.set_defaults(func=_similarity)

    train = sub.add_parser("train", help="train a model on a task").add_subparsers(dest="task", required=True)
    clf = train.add_parser("classifier", help="text classification (e.g. IMDB sentiment) from a recipe")
    clf.add_argument("--config", help="recipe JSON (e.g. recipes/imdb.json)")
    clf.add_argument("--train", help="training file (JSONL/CSV, .gz ok); overrides the recipe")
    clf.add_argument("--test", help="test file, scored with the best checkpoint at the end")
    clf.add_argument("--data-dir", help="what {data} means in recipe paths (default $SCRATCHFORMER_DATA or ../shared/data)")
    clf.add_argument("--out", help="output directory (checkpoints, metrics.jsonl, curves.png, report.json)")
    clf.add_argument("--epochs", type=int)
    clf.add_argument("--max-steps", type=int)
    clf.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    clf.add_argument("--device")
    clf.add_argument("--threads", type=int)
    clf.add_argument("--seed", type=int)
    clf.add_argument("--resume", action="store_true", help="continue from OUT/last")
    clf.set_defaults(func=_train_classifier)

    evaluate = sub.add_parser("evaluate", help="score a classifier checkpoint on labelled data")
    evaluate.add_argument("--checkpoint", required=True)
    evaluate.add_argument("--data", required=True, help="JSONL/CSV file with text and label")
    evaluate.add_argument("--text-field", default="text")
    evaluate.add_argument("--label-field", default="label")
    evaluate.add_argument("--batch-size", type=int, default=64)
    evaluate.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--json", action="store_true")
    evaluate.set_defaults(func=_evaluate)

    classify = sub.add_parser("classify", help="label texts with a classifier checkpoint")
    classify.add_argument("--checkpoint", required=True)
    classify.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    classify.add_argument("--batch-size", type=int, default=64)
    classify.add_argument("--device", default="auto")
    classify.set_defaults(func=_classify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
