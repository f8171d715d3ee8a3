"""The ``scratchformer`` command line, a thin layer over the Python API."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _demo(args: argparse.Namespace) -> int:
    import torch

    from scratchformer.tasks.demo import DemoConfig, run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    figure = None if args.no_figure else args.figure or DemoConfig.figure
    cfg = DemoConfig(task=args.task, steps=args.steps, seed=args.seed, figure=figure)
    result = run_demo(cfg, progress=not args.no_progress)
    print(f"\n{cfg.task} digits: greedy decoding of held-out inputs (KV cache)")
    for source, expected, predicted in result.examples:
        mark = "ok " if expected == predicted else "BAD"
        print(f"  {mark} {source:>12} -> {predicted:<12} (expected {expected})")
    print(
        f"exact-match accuracy {result.accuracy:.1%} on {cfg.eval_size} held-out inputs; "
        f"final loss {result.final_loss:.4f}; {result.seconds:.1f} s"
    )
    attention = result.attention
    if attention is not None and attention.mirror_mass is not None:
        print(f"cross-attention on the mirrored source digit (the anti-diagonal): {attention.mirror_mass:.1%} "
              f"({attention.source} -> {attention.target})")
    if result.figure is not None:
        print(f"attention map: {result.figure}")
    return 0


def _sentence_encoder(args: argparse.Namespace):
    from scratchformer.models.pretrained import default_model_dir
    from scratchformer.tasks.sentence_embedding import SentenceEncoder

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
        for t, v in zip(texts, vectors):
            print(json.dumps({"text": t, "embedding": v}, ensure_ascii=False))
    else:
        for vector in vectors:
            print(" ".join(f"{x:.6f}" for x in vector))
    return 0


def _similarity(args: argparse.Namespace) -> int:
    import json

    score = _sentence_encoder(args).similarity(args.a, args.b)
    print(json.dumps({"text_a": args.a, "text_b": args.b, "score": score}, ensure_ascii=False) if args.json
          else f"{score:.4f}")
    return 0


_GENERATION_FLAGS = {"beam": "num_beams", "nbest": "num_return_sequences", "lenpen": "length_penalty",
                     "max_len_a": "max_len_a", "max_len_b": "max_len_b", "max_new_tokens": "max_new_tokens",
                     "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                     "no_repeat_ngram": "no_repeat_ngram_size", "repetition_penalty": "repetition_penalty",
                     "min_len": "min_new_tokens"}


def _add_generation_options(parser: argparse.ArgumentParser) -> None:
    """The decoding flags of translate, caption and evaluate; unset ones keep the recipe's ``decoding``."""
    g = parser.add_argument_group("generation (default: the recipe's decoding section)")
    g.add_argument("--beam", type=_positive, default=None, help="beam size (1 = greedy)")
    g.add_argument("--nbest", type=_positive, default=None, help="outputs per input: the n best of the beam, or n samples")
    g.add_argument("--lenpen", type=float, default=None, help="length penalty: score = log p / length ** lenpen")
    g.add_argument("--max-len-a", type=float, default=None, help="at most a * S + b new tokens (S: padded source "
                   "length; captioning: image regions, so use --max-new-tokens)")
    g.add_argument("--max-len-b", type=_non_negative, default=None)
    g.add_argument("--max-new-tokens", type=_positive, default=None, help="at most this many new tokens (instead of a, b)")
    g.add_argument("--sampling", action="store_true", help="sample each token instead of beam or greedy search")
    g.add_argument("--temperature", type=float, default=None, help="sampling: logits / temperature")
    g.add_argument("--top-k", type=_non_negative, default=None, help="sampling: among the k most likely tokens (0 = all)")
    g.add_argument("--top-p", type=float, default=None, help="sampling: nucleus, in (0, 1]")
    g.add_argument("--no-repeat-ngram", type=_non_negative, default=None, help="no n-gram of this size twice")
    g.add_argument("--repetition-penalty", type=float, default=None, help="CTRL's penalty on repeated tokens (1 = off)")
    g.add_argument("--min-len", type=_non_negative, default=None, help="no end of sentence before this many tokens")
    g.add_argument("--seed", type=int, default=None, help="sampling: reproducible samples (the same in any batch)")
    g.add_argument("--prefix", default=None, help="every output starts with this text (its tokens are forced)")


def _generation_options(args: argparse.Namespace) -> dict:
    """The generation flags given, as GenerationConfig fields; checked here, before any loading."""
    from scratchformer.generation import GenerationConfig

    options = {field: getattr(args, flag) for flag, field in _GENERATION_FLAGS.items() if getattr(args, flag) is not None}
    sampling_only = [f"--{flag.replace('_', '-')}" for flag in ("temperature", "top_k", "top_p", "seed")
                     if getattr(args, flag) is not None]
    if sampling_only and not args.sampling:
        raise ValueError(f"{', '.join(sampling_only)}: only with --sampling")
    if args.sampling:
        options["do_sample"] = True
        options.setdefault("num_beams", 1)
    # An impossible combination is an error naming it, now (the recipe's beam size is not known yet).
    GenerationConfig(**{"num_beams": options.get("num_return_sequences", 1), **options})
    return options


def _nbest_json(outputs: list) -> list[dict]:
    return [o.to_dict() for o in outputs]


def _print_outputs(key: str, outputs: list, first: dict, as_json: bool, plain_prefix: str) -> None:
    """One input's outputs: a JSON line ({first..., key: best text, score, log_prob, tokens, nbest}), or
    the best text, or (n-best) ``plain_prefix rank<TAB>score<TAB>text`` lines."""
    import json

    best = outputs[0]
    if as_json:
        print(json.dumps({**first, key: best.text, "score": best.score, "log_prob": best.log_prob, "tokens": best.tokens,
                          "nbest": _nbest_json(outputs)}, ensure_ascii=False))
    elif len(outputs) == 1:
        print(f"{plain_prefix}{_one_line(best.text)}")
    else:
        for rank, o in enumerate(outputs):
            print(f"{plain_prefix}{rank}\t{o.score:.4f}\t{_one_line(o.text)}")


def _one_line(text: str) -> str:
    """Plain output is one line per answer: a line break inside one (sampling can draw it) becomes a space."""
    return " ".join(text.splitlines())


_TRAIN_FLAGS = {"out": "out_dir", "epochs": "epochs", "max_steps": "max_steps", "precision": "precision",
                "device": "device", "threads": "threads", "seed": "seed", "overwrite": "overwrite"}


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """The options every ``train`` command shares; they override the recipe's ``train`` section."""
    parser.add_argument("--data-dir", help="what {data} means in recipe paths (default $SCRATCHFORMER_DATA or ../shared/data)")
    parser.add_argument("--out", help="output directory (checkpoints, metrics.jsonl, curves.png, report.json)")
    parser.add_argument("--epochs", type=_positive, help="passes over the training data; replaces the recipe's "
                        "max_steps (which would stop training first) unless --max-steps is given too")
    parser.add_argument("--max-steps", type=_positive, help="optimizer steps in total (instead of epochs)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device")
    parser.add_argument("--threads", type=_non_negative)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/last")
    parser.add_argument("--overwrite", action="store_true", default=None,
                        help="replace an earlier run in OUT (default: refuse to train over it)")


def _train_overrides(args: argparse.Namespace) -> dict:
    overrides = {field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items() if getattr(args, flag) is not None}
    if args.epochs is not None and args.max_steps is None:
        overrides["max_steps"] = None  # the epochs asked for, not the recipe's max_steps, end the run
    return overrides


def _train_classifier(args: argparse.Namespace) -> int:
    import json

    from scratchformer.data.labelled_texts import default_data_dir
    from scratchformer.tasks.classification import ClassifierRecipe, train_classifier

    overrides: dict = {}
    if args.train:
        overrides["train_file"] = args.train
    if args.test:
        overrides["test_file"] = args.test
    if args.pretrained:
        overrides["pretrained"] = args.pretrained
    train_overrides = _train_overrides(args)
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
    _print_on_main(json.dumps(summary, indent=2))
    return 0


def _print_on_main(text: str) -> None:
    """Print, once: under torchrun only rank 0 prints the results."""
    from scratchformer.training import distributed

    if distributed.is_main():
        print(text)


def _train_from_recipe(args: argparse.Namespace, recipe_cls: type, run, **overrides) -> int:
    """The ``train`` commands driven by a recipe alone: read it (the flags override its fields and
    its ``train`` section), run it, print the report (once, under torchrun)."""
    import json

    from scratchformer.data.labelled_texts import default_data_dir

    recipe = recipe_cls.from_json(args.config, **overrides, train=_train_overrides(args))
    report = run(recipe, args.data_dir or default_data_dir(), resume=args.resume)
    _print_on_main(json.dumps(report, indent=2))
    return 0


def _train_translation(args: argparse.Namespace) -> int:
    from scratchformer.tasks.translation import TranslationRecipe, train_translation

    return _train_from_recipe(args, TranslationRecipe, train_translation)


def _train_mlm(args: argparse.Namespace) -> int:
    from scratchformer.tasks.masked_lm import MLMRecipe, pretrain_mlm

    return _train_from_recipe(args, MLMRecipe, pretrain_mlm, **({"train_files": args.texts} if args.texts else {}))


def _train_captioner(args: argparse.Namespace) -> int:
    from scratchformer.tasks.captioning import CaptioningRecipe, train_captioner

    return _train_from_recipe(args, CaptioningRecipe, train_captioner)


def _caption(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from scratchformer.tasks.captioning import load_captioner

    options = _generation_options(args)
    captioner = load_captioner(args.checkpoint, device=args.device)
    photos = None
    try:
        if captioner.photos is not None:  # real photographs: any size, through the image encoder
            images, photos = captioner.photo_features(args.images)
        else:
            images = torch.stack([captioner.load_image(p, resize=args.resize) for p in args.images])
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    results = captioner.generate(images, captioner.generation_config(**options), prefix=args.prefix, seed=args.seed)
    for path, outputs in zip(args.images, results):
        _print_outputs("generated_text", outputs, {"image": str(path)}, args.json, f"{path}\t")
    if args.attention_png:
        out = Path(args.attention_png)
        for i, image in enumerate(images):
            target = out if len(images) == 1 else out.with_name(f"{out.stem}-{i}{out.suffix}")
            captioner.plot_attention(image, target, photo=None if photos is None else photos[i])
            print(f"attention: {target}", file=sys.stderr)
    return 0


def _features(args: argparse.Namespace) -> int:
    from scratchformer.data.image_features import extract_image_features
    from scratchformer.models.image_encoder import ImageEncoder
    from scratchformer.training import resolve_device

    device = resolve_device(args.device)
    features = extract_image_features(args.images, args.out, ImageEncoder().to(device), batch_size=args.batch_size,
                                      device=device, progress=not args.no_progress)
    print(f"{args.out}: {len(features.names)} images, regions {tuple(features.regions.shape)}, "
          f"pooled {tuple(features.pooled.shape)} ({features.description['encoder']})")
    return 0


def _shapes(args: argparse.Namespace) -> int:
    from scratchformer.data.captions import save_caption_folder
    from scratchformer.data.shapes import shape_scene_splits

    size = {"train": "train_size", "valid": "valid_size"}.get(args.split, "test_size")
    sizes = {"train_size": 0, "valid_size": 0, "test_size": 0, size: args.count}
    split = shape_scene_splits(seed=args.seed, **sizes)[args.split]
    print(f"wrote {len(split)} images and {save_caption_folder(split, args.out, args.split)}")
    return 0


def _translate(args: argparse.Namespace) -> int:
    from scratchformer.tasks.translation import load_translator, read_lines

    options = _generation_options(args)
    translator = load_translator(args.checkpoint, device=args.device)
    config = translator.generation_config(**options)
    lines = [args.text] if args.text else sys.stdin
    interactive = not args.text and getattr(sys.stdin, "isatty", lambda: False)()
    buffer = args.buffer_size or (1 if interactive else args.batch_size)
    index = 0
    for chunk in read_lines(lines, buffer):
        results = translator.generate(chunk, config, prefix=args.prefix, seed=args.seed, batch_size=args.batch_size)
        for source, outputs in zip(chunk, results):
            _print_outputs("translation_text", outputs, {"source": source}, args.json,
                           f"{index}\t" if len(outputs) > 1 else "")
            index += 1
        sys.stdout.flush()
    return 0


def _checkpoint_kind(checkpoint: str) -> str | None:
    """The "kind" a checkpoint's config.json records; a Hugging Face Marian directory is a translation model."""
    from scratchformer.models.marian import is_marian_dir
    from scratchformer.training.checkpoint import load_config, resolve_checkpoint

    return "translation" if is_marian_dir(checkpoint) else load_config(resolve_checkpoint(checkpoint)).get("kind")


def _export(args: argparse.Namespace) -> int:
    from scratchformer.models.hf_files import check_new_directory

    check_new_directory(args.out)  # before any loading
    kind = _checkpoint_kind(args.checkpoint)
    if kind == "translation":
        from scratchformer.tasks.translation import load_translator

        written, what = load_translator(args.checkpoint, device="cpu").save_pretrained(args.out, args.format), "Marian (MarianMTModel)"
    elif kind == "text_classifier":
        from scratchformer.tasks.classification import load_classifier

        written, what = load_classifier(args.checkpoint, device="cpu").save_pretrained(args.out, args.format), "BERT (AutoModel)"
    elif kind == "masked_lm":
        from scratchformer.tasks.masked_lm import export_masked_lm

        written, what = export_masked_lm(args.checkpoint, args.out), "BERT (BertForMaskedLM, AutoModel)"
    else:
        raise ValueError(f"{args.checkpoint}: a {kind!r} checkpoint has no Hugging Face format "
                         "(translation, text_classifier and masked_lm checkpoints do)")
    print(f"wrote a Hugging Face {what} directory: {written}")
    return 0


def _attention(args: argparse.Namespace) -> int:
    from scratchformer.tasks.translation import translation_attention_maps
    from scratchformer.tasks.translation import load_translator

    translation, written = translation_attention_maps(
        load_translator(args.checkpoint, device="cpu"), args.text, args.out, beam_size=args.beam
    )
    print(f"translation: {translation}")
    print("\n".join(str(p) for p in written))
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

    from scratchformer.data.labelled_texts import load_labelled_texts
    from scratchformer.tasks.classification import load_classifier

    kind = _checkpoint_kind(args.checkpoint)
    args.generation = _generation_options(args)
    if kind not in ("translation", "captioning") and (args.generation or args.prefix):
        raise ValueError(f"decoding flags ({', '.join(sorted(args.generation))}) apply to translation and "
                         "captioning models, not to a classifier")
    if kind == "translation":
        return _evaluate_translation(args)
    if kind == "captioning":
        return _evaluate_captioning(args)
    if not args.data:
        raise SystemExit("error: --data FILE is required to evaluate a classifier")

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


def _evaluate_translation(args: argparse.Namespace) -> int:

    from scratchformer.data.labelled_texts import open_text
    from scratchformer.tasks.translation import load_translator

    if not (args.source and args.reference):
        raise SystemExit("error: --source FILE and --reference FILE are required to evaluate a translation model")
    with open_text(args.source) as f:  # lines as training and the recipe's test read them (strip)
        sources = [line.strip() for line in f]
    with open_text(args.reference) as f:
        references = [line.strip() for line in f]
    if len(sources) != len(references):
        raise SystemExit(f"error: {len(sources)} source lines but {len(references)} reference lines")
    translator = load_translator(args.checkpoint, device=args.device)
    with _autocast(translator.device, args.precision):
        scores = translator.evaluate(sources, references, config=translator.generation_config(**args.generation),
                                     prefix=args.prefix, seed=args.seed, batch_size=args.batch_size)
    return _print_scores(args, scores, "BLEU {bleu:.2f}  chrF {chrf:.2f}  ({n} sentences; {bleu_signature})")


def _autocast(device, precision: str):
    """Translation and captioning evaluation under ``--precision`` (bf16: autocast, as a classifier's)."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _print_scores(args: argparse.Namespace, scores: dict, line: str) -> int:
    """Write the hypotheses to ``--output`` (if given); print the scores as JSON or as ``line``."""
    import json

    hypotheses = scores.pop("hypotheses")
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(hypotheses) + "\n")
    print(json.dumps(scores) if args.json else line.format(**scores))
    return 0


def _evaluate_captioning(args: argparse.Namespace) -> int:

    from scratchformer.data.caption_corpora import load_flickr8k, load_karpathy_json
    from scratchformer.data.captions import CaptionExamples, load_caption_folder
    from scratchformer.tasks.captioning import load_captioner

    if not (args.flickr8k or args.karpathy or (args.captions and args.images)):
        raise SystemExit("error: a captioning model is evaluated on --flickr8k DIR, --karpathy JSON --images DIR, "
                         "or --captions TSV --images DIR")
    if args.karpathy and not args.images:
        raise SystemExit("error: --karpathy JSON needs --images DIR (the folder its file paths are under)")
    captioner = load_captioner(args.checkpoint, device=args.device)
    if args.flickr8k or args.karpathy:
        corpus = (load_flickr8k(args.flickr8k, args.split or "dev") if args.flickr8k
                  else load_karpathy_json(args.karpathy, args.images, args.split or "test"))
        print(corpus.report(), file=sys.stderr)
        examples = CaptionExamples(captioner.corpus_features(corpus, args.features), corpus.references)
    else:
        examples, _ = load_caption_folder(args.captions, args.images, captioner.model.config.image_size
                                          if captioner.model.config.input == "pixels" else None)
    with _autocast(captioner.device, args.precision):
        scores = captioner.evaluate(examples, config=captioner.generation_config(**args.generation), prefix=args.prefix,
                                    seed=args.seed, batch_size=args.batch_size)
    return _print_scores(args, scores, "BLEU-1 {bleu1:.2f}  BLEU-2 {bleu2:.2f}  BLEU-3 {bleu3:.2f}  BLEU-4 {bleu4:.2f}  "
                                       "CIDEr-D {cider:.2f}  exact match {exact_match:.1%}  ({n} images)")


def _classify(args: argparse.Namespace) -> int:
    from scratchformer.tasks.classification import load_classifier

    import json

    clf = load_classifier(args.checkpoint, device=args.device)
    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, (label, prob) in zip(texts, clf.predict(texts, batch_size=args.batch_size)):
        print(json.dumps({"text": text, "label": label, "score": prob}, ensure_ascii=False) if args.json
              else f"{label}\t{prob:.4f}\t{text}")
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
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (anywhere on the line; or SCRATCHFORMER_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a tiny encoder-decoder on a synthetic task (offline, < 1 min)")
    demo.add_argument("--task", choices=["reverse", "sort"], default="reverse")
    demo.add_argument("--steps", type=_positive, default=700, help="training steps (default 700)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=_non_negative, default=0, help="torch CPU threads (default: torch's choice)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    figure = demo.add_mutually_exclusive_group()
    figure.add_argument("--figure", metavar="PATH", help="where to draw the cross-attention map of one held-out "
                        "input, a PNG (default runs/demo/attention.png; folders are made)")
    figure.add_argument("--no-figure", action="store_true", help="draw no attention map (headless use)")
    demo.set_defaults(func=_demo)

    embed = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT-family checkpoint")
    _add_model_argument(embed)
    embed.add_argument("texts", nargs="*", help="texts to embed (default: one per line on stdin)")
    embed.add_argument("--json", action="store_true", help='one {"text": ..., "embedding": [...]} per line')
    embed.add_argument("--batch-size", type=_positive, default=32)
    embed.set_defaults(func=_embed)

    similarity = sub.add_parser("similarity", help="cosine similarity of two texts' sentence embeddings")
    _add_model_argument(similarity)
    similarity.add_argument("a")
    similarity.add_argument("b")
    similarity.add_argument("--json", action="store_true", help='print {"text_a", "text_b", "score"}')
    similarity.set_defaults(func=_similarity)

    train = sub.add_parser("train", help="train a model on a task").add_subparsers(dest="task", required=True)
    clf = train.add_parser("classifier", help="text classification (e.g. IMDB sentiment) from a recipe")
    clf.add_argument("--config", help="recipe JSON (e.g. recipes/imdb.json)")
    clf.add_argument("--train", help="training file (JSONL/CSV, .gz ok); overrides the recipe")
    clf.add_argument("--test", help="test file, scored with the best checkpoint at the end")
    clf.add_argument("--pretrained", help="a BERT-family checkpoint directory to fine-tune (its tokenizer too); "
                     "overrides the recipe's")
    _add_training_options(clf)
    clf.set_defaults(func=_train_classifier)

    mt = train.add_parser("translation", help="machine translation (e.g. Multi30k German-English) from a recipe")
    mt.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/multi30k_de_en.json)")
    _add_training_options(mt)
    mt.set_defaults(func=_train_translation)

    mlm = train.add_parser("mlm", help="masked-language-model pretraining of a BERT encoder on unlabelled text "
                           "(e.g. IMDB's unlabelled reviews) from a recipe")
    mlm.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/imdb_mlm.json)")
    mlm.add_argument("--texts", nargs="+", help="text files (JSONL/CSV/plain text, .gz ok); override train_files")
    _add_training_options(mlm)
    mlm.set_defaults(func=_train_mlm)

    cap = train.add_parser("captioner", help="image captioning from a recipe (Flickr8k photographs, the built-in shape scenes, ...)")
    cap.add_argument("--config", required=True, help="recipe JSON (e.g. recipes/shapes_captioning.json)")
    _add_training_options(cap)
    cap.set_defaults(func=_train_captioner)

    caption = sub.add_parser("caption", help="caption image files with a captioning checkpoint")
    caption.add_argument("--checkpoint", required=True)
    caption.add_argument("images", nargs="+", help="image files (a photo model: any size and format Pillow reads)")
    _add_generation_options(caption)
    caption.add_argument("--json", action="store_true", help='one {"image", "generated_text", "score", "nbest"} per line')
    caption.add_argument("--resize", action="store_true", help="resize images to the model's size (default: error)")
    caption.add_argument("--attention-png", help="write each word's cross-attention over the image here "
                         "(several images: NAME-0.png, NAME-1.png, ...)")
    caption.add_argument("--device", default="auto")
    caption.set_defaults(func=_caption)

    features = sub.add_parser("features", help="image features of a folder of photographs (frozen EfficientNet-Lite0: "
                              "7x7x1280 regions and the pooled vector) into a safetensors file; resumable")
    features.add_argument("--images", required=True, help="folder of image files (any size, any format Pillow reads)")
    features.add_argument("--out", required=True, help="the .safetensors file (images already in it are skipped)")
    features.add_argument("--batch-size", type=_positive, default=32)
    features.add_argument("--device", default="auto")
    features.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    features.set_defaults(func=_features)

    shapes = sub.add_parser("shapes", help="write rendered shape scenes as PNGs with a captions TSV")
    shapes.add_argument("--split", choices=["train", "valid", "test_seen", "test_heldout"], default="test_heldout")
    shapes.add_argument("--count", type=_positive, default=8)
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--out", default="shapes")
    shapes.set_defaults(func=_shapes)

    translate = sub.add_parser("translate", help="translate stdin to stdout, one sentence per line (streaming)")
    translate.add_argument("--checkpoint", required=True, help="our translation checkpoint, or a Hugging Face "
                           "Marian directory (opus-mt: config.json, model.safetensors, source.spm, target.spm, vocab.json)")
    _add_generation_options(translate)
    translate.add_argument("--batch-size", type=_positive, default=32, help="sentences decoded together")
    translate.add_argument("--buffer-size", type=_positive, default=None, help="lines read before translating "
                           "(default: 1 when stdin is a terminal, so each line is answered at once; else --batch-size)")
    translate.add_argument("--json", action="store_true", help='one {"translation_text", "score", "tokens", "nbest", '
                           '...} per line')
    translate.add_argument("--device", default="auto")
    translate.add_argument("text", nargs="?", help="one sentence (default: lines of stdin)")
    translate.set_defaults(func=_translate)

    export = sub.add_parser("export", help="write a checkpoint in the Hugging Face format: a translator as a Marian "
                            "directory (MarianMTModel), a classifier's encoder or a masked LM as a BERT directory (AutoModel)")
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--out", required=True, help="a new directory")
    export.add_argument("--format", choices=["hf"], default="hf")
    export.set_defaults(func=_export)

    attention = sub.add_parser("attention", help="PNG heatmaps of a translation model's attention for one sentence")
    attention.add_argument("--checkpoint", required=True)
    attention.add_argument("text")
    attention.add_argument("--out", default="attention", help="output directory for the PNGs")
    attention.add_argument("--beam", type=_positive, default=5)
    attention.set_defaults(func=_attention)

    evaluate = sub.add_parser("evaluate", help="score a checkpoint: a classifier (accuracy, F1), a translator (BLEU, chrF) "
                              "or a captioner (BLEU-1..4, CIDEr-D, exact match)")
    evaluate.add_argument("--checkpoint", required=True)
    evaluate.add_argument("--data", help="classifier: JSONL/CSV file with text and label")
    evaluate.add_argument("--source", help="translation: source sentences, one per line (.gz ok)")
    evaluate.add_argument("--reference", help="translation: reference translations, one per line")
    evaluate.add_argument("--captions", help="captioning: captions TSV (image_id<TAB>caption)")
    evaluate.add_argument("--images", help="captioning: the folder of images or feature files (with --captions), "
                          "or of the photos of --karpathy")
    evaluate.add_argument("--flickr8k", help="captioning: a Flickr8k folder (Images/, captions.txt, split lists)")
    evaluate.add_argument("--karpathy", help="captioning: a Karpathy split JSON (dataset_coco.json, ...)")
    evaluate.add_argument("--split", help="captioning: the split of --flickr8k (default dev) or --karpathy (default test)")
    evaluate.add_argument("--features", help="captioning: image features file to reuse (extracted into it if missing)")
    _add_generation_options(evaluate)
    evaluate.add_argument("--output", help="translation/captioning: write the hypotheses here")
    evaluate.add_argument("--text-field", default="text")
    evaluate.add_argument("--label-field", default="label")
    evaluate.add_argument("--batch-size", type=_positive, default=64, help="examples per batch")
    evaluate.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (CPU or GPU)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--json", action="store_true", help="the scores as one JSON object")
    evaluate.set_defaults(func=_evaluate)

    classify = sub.add_parser("classify", help="label texts with a classifier checkpoint")
    classify.add_argument("--checkpoint", required=True)
    classify.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    classify.add_argument("--batch-size", type=_positive, default=64)
    classify.add_argument("--device", default="auto")
    classify.add_argument("--json", action="store_true", help='one {"text", "label", "score"} per line')
    classify.set_defaults(func=_classify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. ``torchrun --nproc-per-node N -m scratchformer train ...`` runs a
    ``train`` command in N processes (the trainer joins them; see docs/guides/distributed.md).

    An error is one line on stderr naming the problem, exit code 2; ``--debug`` (or
    SCRATCHFORMER_DEBUG=1) shows the traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    args.debug = "--debug" in argv
    try:
        code = args.func(args)
    except Exception as e:  # noqa: BLE001 - every error becomes one line (the traceback behind --debug)
        if args.debug or os.environ.get("SCRATCHFORMER_DEBUG"):
            raise
        message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        print(f"error: {message}" + ("" if isinstance(e, (ValueError, TypeError, OSError)) else f" ({type(e).__name__}; "
              "--debug for the traceback)"), file=sys.stderr)
        return 2
    if args.command == "train":
        from scratchformer.training import distributed

        distributed.destroy()  # leave the process group (no-op in a single process)
    return code


if __name__ == "__main__":
    sys.exit(main())
