"""The commands that run a trained model on new input: ``translate``, ``caption``, ``classify``,
``embed`` and ``similarity``; each command's parser sits beside the function that runs it."""

from __future__ import annotations

import argparse
import sys

from scratchformer.cli.options import add_generation_options, generation_options, positive, print_outputs

__all__ = ["add_caption", "add_classify", "add_embed", "add_similarity", "add_translate"]


# ------------------------------------------------------------------------------------------------ translate


def add_translate(sub: argparse._SubParsersAction) -> None:
    translate = sub.add_parser(
        "translate", help="translate stdin to stdout, one sentence per line (streaming)"
    )
    translate.add_argument(
        "--checkpoint",
        required=True,
        help="our translation checkpoint, or a Hugging Face "
        "Marian directory (opus-mt: config.json, model.safetensors, source.spm, target.spm, vocab.json)",
    )
    add_generation_options(translate)
    translate.add_argument("--batch-size", type=positive, default=32, help="sentences decoded together")
    translate.add_argument(
        "--buffer-size",
        type=positive,
        default=None,
        help="lines read before translating "
        "(default: 1 when stdin is a terminal, so each line is answered at once; else --batch-size)",
    )
    translate.add_argument(
        "--json",
        action="store_true",
        help='one {"translation_text", "score", "tokens", "nbest", ...} per line',
    )
    translate.add_argument("--device", default="auto")
    translate.add_argument("text", nargs="?", help="one sentence (default: lines of stdin)")
    translate.set_defaults(func=_translate)


def _translate(args: argparse.Namespace) -> int:
    from scratchformer.tasks.translation import load_translator, read_lines

    options = generation_options(args)
    translator = load_translator(args.checkpoint, device=args.device)
    config = translator.generation_config(**options)
    lines = [args.text] if args.text else sys.stdin
    interactive = not args.text and getattr(sys.stdin, "isatty", lambda: False)()
    buffer = args.buffer_size or (1 if interactive else args.batch_size)
    index = 0
    for chunk in read_lines(lines, buffer):
        results = translator.generate(
            chunk, config, prefix=args.prefix, seed=args.seed, batch_size=args.batch_size
        )
        for source, outputs in zip(chunk, results):
            print_outputs(
                "translation_text",
                outputs,
                {"source": source},
                args.json,
                f"{index}\t" if len(outputs) > 1 else "",
            )
            index += 1
        sys.stdout.flush()
    return 0


# ------------------------------------------------------------------------------------------------ caption


def add_caption(sub: argparse._SubParsersAction) -> None:
    caption = sub.add_parser("caption", help="caption image files with a captioning checkpoint")
    caption.add_argument("--checkpoint", required=True)
    caption.add_argument(
        "images", nargs="+", help="image files (a photo model: any size and format Pillow reads)"
    )
    add_generation_options(caption)
    caption.add_argument(
        "--json", action="store_true", help='one {"image", "generated_text", "score", "nbest"} per line'
    )
    caption.add_argument(
        "--resize", action="store_true", help="resize images to the model's size (default: error)"
    )
    caption.add_argument(
        "--attention-png",
        help="write each word's cross-attention over the image here "
        "(several images: NAME-0.png, NAME-1.png, ...)",
    )
    caption.add_argument("--device", default="auto")
    caption.set_defaults(func=_caption)


def _caption(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from scratchformer.tasks.captioning import load_captioner

    options = generation_options(args)
    captioner = load_captioner(args.checkpoint, device=args.device)
    photos = None
    try:
        if captioner.photos is not None:  # real photographs: any size, through the image encoder
            images, photos = captioner.photo_features(args.images)
        else:
            images = torch.stack([captioner.load_image(p, resize=args.resize) for p in args.images])
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    results = captioner.generate(
        images, captioner.generation_config(**options), prefix=args.prefix, seed=args.seed
    )
    for path, outputs in zip(args.images, results):
        print_outputs("generated_text", outputs, {"image": str(path)}, args.json, f"{path}\t")
    if args.attention_png:
        out = Path(args.attention_png)
        for i, image in enumerate(images):
            target = out if len(images) == 1 else out.with_name(f"{out.stem}-{i}{out.suffix}")
            captioner.plot_attention(image, target, photo=None if photos is None else photos[i])
            print(f"attention: {target}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------------ classify


def add_classify(sub: argparse._SubParsersAction) -> None:
    classify = sub.add_parser("classify", help="label texts with a classifier checkpoint")
    classify.add_argument("--checkpoint", required=True)
    classify.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    classify.add_argument("--batch-size", type=positive, default=64)
    classify.add_argument("--device", default="auto")
    classify.add_argument("--json", action="store_true", help='one {"text", "label", "score"} per line')
    classify.set_defaults(func=_classify)


def _classify(args: argparse.Namespace) -> int:
    import json

    from scratchformer.tasks.classification import load_classifier

    clf = load_classifier(args.checkpoint, device=args.device)
    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, (label, prob) in zip(texts, clf.predict(texts, batch_size=args.batch_size)):
        print(
            json.dumps({"text": text, "label": label, "score": prob}, ensure_ascii=False)
            if args.json
            else f"{label}\t{prob:.4f}\t{text}"
        )
    return 0


# ------------------------------------------------------------------------------------------ embed, similarity


def add_embed(sub: argparse._SubParsersAction) -> None:
    embed = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT-family checkpoint")
    _add_model_argument(embed)
    embed.add_argument("texts", nargs="*", help="texts to embed (default: one per line on stdin)")
    embed.add_argument("--json", action="store_true", help='one {"text": ..., "embedding": [...]} per line')
    embed.add_argument("--batch-size", type=positive, default=32)
    embed.set_defaults(func=_embed)


def add_similarity(sub: argparse._SubParsersAction) -> None:
    similarity = sub.add_parser("similarity", help="cosine similarity of two texts' sentence embeddings")
    _add_model_argument(similarity)
    similarity.add_argument("a")
    similarity.add_argument("b")
    similarity.add_argument("--json", action="store_true", help='print {"text_a", "text_b", "score"}')
    similarity.set_defaults(func=_similarity)


def _add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="BERT-family checkpoint directory (config.json, model.safetensors, tokenizer.json); "
        "default $SCRATCHFORMER_MODEL, else all-MiniLM-L6-v2 from the 'pretrained' extra",
    )


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
    print(
        json.dumps({"text_a": args.a, "text_b": args.b, "score": score}, ensure_ascii=False)
        if args.json
        else f"{score:.4f}"
    )
    return 0
