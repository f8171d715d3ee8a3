"""``scratchformer train classifier | translation | mlm | captioner``: a recipe, changed by ``--set
KEY=VALUE`` (any field) and by the shorthand flags (``--epochs``, ``--out``, ...), which win."""

from __future__ import annotations

import argparse

from scratchformer.cli.options import add_progress_option, add_threads_option, positive, seed
from scratchformer.cli.paths import require_recipe
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR, default_data_dir

__all__ = ["add_train"]

_TRAIN_FLAGS = {
    "out": "out_dir",
    "epochs": "epochs",
    "max_steps": "max_steps",
    "precision": "precision",
    "device": "device",
    "threads": "threads",
    "seed": "seed",
    "overwrite": "overwrite",
}


def add_train(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model on a task").add_subparsers(dest="task", required=True)
    clf = train.add_parser("classifier", help="text classification (e.g. IMDB sentiment) from a recipe")
    clf.add_argument("--config", help="recipe JSON (e.g. recipes/imdb.json)")
    clf.add_argument("--train", help="training file (JSONL/CSV, .gz ok); overrides the recipe")
    clf.add_argument("--test", help="test file, scored with the best checkpoint at the end")
    clf.add_argument(
        "--pretrained",
        help="a BERT-family checkpoint directory to fine-tune (its tokenizer too); overrides the recipe's",
    )
    _add_training_options(clf)
    clf.set_defaults(func=_train_classifier)

    mt = train.add_parser(
        "translation", help="machine translation (e.g. Multi30k German-English) from a recipe"
    )
    mt.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/multi30k_de_en.json)")
    _add_training_options(mt)
    mt.set_defaults(func=_train_translation)

    mlm = train.add_parser(
        "mlm",
        help="masked-language-model pretraining of a BERT encoder on unlabelled text "
        "(e.g. IMDB's unlabelled reviews) from a recipe",
    )
    mlm.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/imdb_mlm.json)")
    mlm.add_argument(
        "--texts", nargs="+", help="text files (JSONL/CSV/plain text, .gz ok); override train_files"
    )
    _add_training_options(mlm)
    mlm.set_defaults(func=_train_mlm)

    cap = train.add_parser(
        "captioner",
        help="image captioning from a recipe (Flickr8k photographs, the built-in shape scenes, ...)",
    )
    cap.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/shapes_captioning.json)")
    _add_training_options(cap)
    cap.set_defaults(func=_train_captioner)


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """The options every ``train`` command shares; they override the recipe's ``train`` section."""
    parser.add_argument(
        "--data-dir",
        help=f"what {{data}} means in recipe paths (default $SCRATCHFORMER_DATA or {DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--out", help="output directory (checkpoints, metrics.jsonl, curves.png, report.json)"
    )
    parser.add_argument(
        "--epochs",
        type=positive,
        help="passes over the training data; replaces the recipe's "
        "max_steps (which would stop training first) unless --max-steps is given too",
    )
    parser.add_argument("--max-steps", type=positive, help="optimizer steps in total (instead of epochs)")
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16", "fp64"],
        help="auto: bf16 where the device computes it natively (AMX or AVX512_BF16; CUDA), else fp32",
    )
    parser.add_argument("--device")
    add_threads_option(parser)
    parser.add_argument("--seed", type=seed)
    add_progress_option(parser)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/last")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace an earlier run in OUT (default: refuse to train over it)",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any recipe field, as the file would: train.lr=3e-4, model.dropout=0.2, "
        "decoding.beam_size=4 (VALUE is JSON where it parses, else text; repeatable; "
        "the flags above win over it)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved recipe (defaults, --set and flags applied) as JSON and exit",
    )


def _train_overrides(args: argparse.Namespace) -> dict:
    """The ``train`` fields the flags give (applied after ``--set``, so they win over it)."""
    from scratchformer.training.recipe import parse_set

    if args.resume and any(parse_set(s) == (["train", "overwrite"], True) for s in args.sets):
        raise ValueError(  # as --resume --overwrite is: the flags are shorthands for --set
            "--resume continues the run in OUT and --set train.overwrite=true replaces it: give one of them"
        )
    overrides = {
        field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items() if getattr(args, flag) is not None
    }
    if args.epochs is not None and args.max_steps is None:
        overrides["max_steps"] = None  # the epochs asked for, not the recipe's max_steps, end the run
    if args.no_progress:
        overrides["progress"] = False
    return overrides


def _run_recipe(args: argparse.Namespace, recipe, run, summarize=None) -> int:
    """``--print-config``: print the resolved recipe (a JSON recipe to save and rerun), train nothing;
    else run it and print its report (``summarize``d; once, under torchrun)."""
    import json

    if args.print_config:
        _print_on_main(json.dumps(recipe.to_dict(), indent=2))
        return 0
    report = run(recipe, args.data_dir or default_data_dir(), resume=args.resume)
    _print_on_main(json.dumps(summarize(report) if summarize else report, indent=2))
    return 0


def _train_classifier(args: argparse.Namespace) -> int:
    overrides: dict = {}
    if args.train:
        overrides["train_file"] = args.train
    if args.test:
        overrides["test_file"] = args.test
    if args.pretrained:
        overrides["pretrained"] = args.pretrained
    if not (args.config or args.train or any(s.startswith("train_file=") for s in args.sets)):
        raise ValueError("give --config RECIPE.json or --train FILE")
    if args.config:
        require_recipe(args.config)  # the checks so far need no torch; the work below does

    from scratchformer.tasks.classification import ClassifierRecipe, train_classifier
    from scratchformer.training.recipe import load_recipe

    # without --config, the recipe's defaults, with --set and the flags
    recipe = load_recipe(ClassifierRecipe, args.config, args.sets, train=_train_overrides(args), **overrides)

    def summarize(report: dict) -> dict:
        summary = {k: v for k, v in report.items() if k != "test"}
        if "test" in report:
            summary["test"] = {k: report["test"][k] for k in ("accuracy", "macro_f1", "n")}
        return summary

    return _run_recipe(args, recipe, train_classifier, summarize)


def _print_on_main(text: str) -> None:
    """Print, once: under torchrun only rank 0 prints the results."""
    from scratchformer.training import distributed

    if distributed.is_main():
        print(text)


def _train_from_recipe(args: argparse.Namespace, recipe_cls: type, run, **overrides) -> int:
    """The ``train`` commands driven by a recipe alone: read it (``--set``, then the flags, change its
    fields and its ``train`` section), run it (or print it), print the report."""
    recipe = recipe_cls.from_json(args.config, args.sets, **overrides, train=_train_overrides(args))
    return _run_recipe(args, recipe, run)


def _train_translation(args: argparse.Namespace) -> int:
    require_recipe(args.config)  # before torch is imported

    from scratchformer.tasks.translation import TranslationRecipe, train_translation

    return _train_from_recipe(args, TranslationRecipe, train_translation)


def _train_mlm(args: argparse.Namespace) -> int:
    require_recipe(args.config)  # before torch is imported

    from scratchformer.tasks.masked_lm import MLMRecipe, pretrain_mlm

    return _train_from_recipe(
        args, MLMRecipe, pretrain_mlm, **({"train_files": args.texts} if args.texts else {})
    )


def _train_captioner(args: argparse.Namespace) -> int:
    require_recipe(args.config)  # before torch is imported

    from scratchformer.tasks.captioning import CaptioningRecipe, train_captioner

    return _train_from_recipe(args, CaptioningRecipe, train_captioner)
