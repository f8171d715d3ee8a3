"""The commands around the models: the ``demo``, image ``features``, rendered ``shapes`` scenes,
``export`` for serving (Hugging Face, CTranslate2, ONNX) and a translation's ``attention`` maps."""

from __future__ import annotations

import argparse
from pathlib import Path

from scratchformer.cli.options import add_progress_option, add_threads_option, positive, seed
from scratchformer.cli.paths import require_checkpoint

__all__ = ["add_attention", "add_demo", "add_export", "add_features", "add_shapes"]


def out_path(text: str) -> str:
    """``--out``: a path, not empty ("" would mean the working folder, or no file at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or folder, got {text!r}")
    return text


# ------------------------------------------------------------------------------------------------ demo


def add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="train a tiny encoder-decoder on a synthetic task (offline, < 1 min)")
    demo.add_argument("--task", choices=["reverse", "sort"], default="reverse")
    demo.add_argument("--steps", type=positive, default=450, help="training steps (default 450)")
    demo.add_argument("--seed", type=seed, default=0)
    add_threads_option(demo)
    add_progress_option(demo)
    figure = demo.add_mutually_exclusive_group()
    figure.add_argument(
        "--figure",
        metavar="PATH",
        help="where to draw the cross-attention map of one held-out "
        "input, a PNG (default runs/demo/attention.png; folders are made)",
    )
    figure.add_argument("--no-figure", action="store_true", help="draw no attention map (headless use)")
    demo.set_defaults(func=_demo)


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
        print(
            f"cross-attention on the mirrored source digit (the anti-diagonal): {attention.mirror_mass:.1%} "
            f"({attention.source} -> {attention.target})"
        )
    if result.figure is not None:
        print(f"attention map: {result.figure}")
    return 0


# ------------------------------------------------------------------------------------------- features, shapes


def add_features(sub: argparse._SubParsersAction) -> None:
    features = sub.add_parser(
        "features",
        help="image features of a folder of photographs (a frozen EfficientNet-Lite0/1/2: "
        "7x7, 8x8 or 9x9 regions of 1280 features and the pooled vector) into a safetensors file; resumable",
    )
    features.add_argument(
        "--encoder",
        choices=["efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2"],
        default="efficientnet-lite0",
        help="the image encoder, at its native resolution 224, 240 or 260 px (default: %(default)s)",
    )
    features.add_argument(
        "--images", required=True, help="folder of image files (any size, any format Pillow reads)"
    )
    features.add_argument(
        "--out", required=True, type=out_path, help="the .safetensors file (images already in it are skipped)"
    )
    features.add_argument(
        "--top-stages",
        type=int,
        choices=range(8),
        default=0,
        metavar="K",
        help="the regions below the encoder's top K stages (a recipe's finetune.stages: the input of "
        "the stages it trains); default 0: the head's regions",
    )
    features.add_argument("--batch-size", type=positive, default=32)
    features.add_argument("--device", default="auto")
    add_progress_option(features)
    features.add_argument(
        "--strict",
        action="store_true",
        help="refuse files of --images that are not images (default: skip them, with a count)",
    )
    features.set_defaults(func=_features)


def _features(args: argparse.Namespace) -> int:
    from scratchformer.data.image_features import extract_image_features
    from scratchformer.models.image_encoder import ImageEncoder
    from scratchformer.training import resolve_device

    device = resolve_device(args.device)
    features = extract_image_features(
        args.images,
        args.out,
        ImageEncoder(args.encoder, args.top_stages).to(device),
        batch_size=args.batch_size,
        device=device,
        progress=not args.no_progress,
        strict=args.strict,
    )
    print(
        f"{args.out}: {len(features.names)} images, regions {tuple(features.regions.shape)}, "
        f"pooled {tuple(features.pooled.shape)} ({features.description['encoder']})"
    )
    return 0


def add_shapes(sub: argparse._SubParsersAction) -> None:
    shapes = sub.add_parser("shapes", help="write rendered shape scenes as PNGs with a captions TSV")
    shapes.add_argument(
        "--split", choices=["train", "valid", "test_seen", "test_heldout"], default="test_heldout"
    )
    shapes.add_argument("--count", type=positive, default=8)
    shapes.add_argument("--seed", type=seed, default=0)
    shapes.add_argument("--out", type=out_path, default="shapes", help="the folder (default: %(default)s)")
    shapes.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the captions.tsv and the images of the same names already in --out "
        "(default: refuse to write over them)",
    )
    shapes.set_defaults(func=_shapes)


def _shapes(args: argparse.Namespace) -> int:
    _refuse_over_shapes(args.out, args.split, args.count, args.overwrite)  # before any work
    from scratchformer.data.captions import save_caption_folder
    from scratchformer.data.shapes import shape_scene_splits

    size = {"train": "train_size", "valid": "valid_size"}.get(args.split, "test_size")
    sizes = {"train_size": 0, "valid_size": 0, "test_size": 0, size: args.count}
    split = shape_scene_splits(seed=args.seed, **sizes)[args.split]
    print(f"wrote {len(split)} images and {save_caption_folder(split, args.out, args.split)}")
    return 0


def _refuse_over_shapes(out: str, split: str, count: int, overwrite: bool) -> None:
    """``shapes --out``: a folder (or none yet) without a captions.tsv or any of the images this
    writes (``SPLIT-0000.png``..., save_caption_folder's names), unless ``--overwrite``."""
    from pathlib import Path

    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a folder")
    names = ["captions.tsv", *(f"{split}-{i:04d}.png" for i in range(count))]
    there = [name for name in names if (folder / name).exists()]
    if there and not overwrite:
        more = f" (and {len(there) - 1} of the images this writes)" if len(there) > 1 else ""
        raise FileExistsError(
            f"--out {out} already holds {there[0]}{more}: --overwrite replaces them, or choose another folder"
        )


# ------------------------------------------------------------------------------------------ export, attention


EXPORT_FORMATS = {  # what each kind of checkpoint can be written as
    "translation": ("hf", "ctranslate2", "onnx"),
    "text_classifier": ("hf", "onnx"),
    "masked_lm": ("hf", "onnx"),
    "embedding": ("onnx",),  # a sentence-transformers (or BERT-family) encoder
}


def add_export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="write a checkpoint for serving: --format hf (a translator as a Marian or Pegasus directory, "
        "a classifier with pooling 'pooler' as BertForSequenceClassification, a masked LM as "
        "BertForMaskedLM), ctranslate2 (a translator, for ctranslate2.Translator) or onnx (a translator, "
        "classifier, masked LM or sentence-transformers encoder, for onnxruntime)",
    )
    export.add_argument("--checkpoint", required=True)
    export.add_argument("--out", required=True, type=out_path, help="a new directory")
    export.add_argument("--format", choices=["hf", "ctranslate2", "onnx"], default="hf")
    export.add_argument(
        "--quantization",
        choices=["int8", "int8_float32", "int16", "float16", "bfloat16"],
        default=None,
        help="ctranslate2: the weights' type on disk (default float32; ctranslate2.Translator's "
        "compute_type can convert again when loading)",
    )
    export.add_argument(
        "--truncation",
        choices=["head"],
        default=None,
        help="hf classifier: export cutting long texts at the end (transformers cannot cut head + tail, "
        "our default); our own commands then cut them so too",
    )
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    require_checkpoint(args.checkpoint)  # a missing path: named before torch is imported

    from scratchformer.formats.hf_files import check_new_directory
    from scratchformer.tasks.shared.kinds import checkpoint_kind

    check_new_directory(args.out)  # before any loading
    kind = checkpoint_kind(args.checkpoint)
    if kind == "embedding" and args.format != "onnx":  # a Hugging Face directory: say what it is
        raise ValueError(
            _foreign_encoder(args.checkpoint) + "; as a sentence encoder it exports with --format onnx"
        )
    if args.format not in EXPORT_FORMATS.get(kind, ()):
        offered = ", ".join(f"{k}: {'/'.join(v)}" for k, v in EXPORT_FORMATS.items())
        raise ValueError(f"{args.checkpoint}: a {kind!r} checkpoint has no {args.format} format ({offered})")
    if args.quantization and args.format != "ctranslate2":
        raise ValueError("--quantization applies to --format ctranslate2 only")
    if args.truncation and (kind, args.format) != ("text_classifier", "hf"):
        raise ValueError("--truncation applies to a classifier's --format hf only")
    written, what = _EXPORTERS[kind](args)
    print(f"wrote {what} directory: {written}")
    return 0


def _foreign_encoder(checkpoint: str) -> str:
    """What an encoder directory that is not ours holds, for ``export --format hf``'s refusal."""
    from scratchformer.training.checkpoint import foreign_checkpoint, load_config

    config = load_config(checkpoint) if (Path(checkpoint) / "config.json").is_file() else {}
    return foreign_checkpoint(checkpoint, config, "translation, text_classifier or masked_lm")


def _export_translation(args: argparse.Namespace) -> tuple[object, str]:
    from scratchformer.tasks.translation import load_translator

    translator = load_translator(args.checkpoint, device="cpu")
    written = translator.save_pretrained(args.out, args.format, quantization=args.quantization)
    what = {
        "hf": "a Hugging Face "
        + ("Pegasus" if translator.model.config.norm_first else "Marian")
        + " (AutoModelForSeq2SeqLM)",
        "ctranslate2": "a CTranslate2 (ctranslate2.Translator)",
        "onnx": "an ONNX (encoder.onnx + decoder.onnx with past key/values, onnxruntime)",
    }[args.format]
    return written, what


def _export_classifier(args: argparse.Namespace) -> tuple[object, str]:
    from scratchformer.tasks.classification import load_classifier

    classifier = load_classifier(args.checkpoint, device="cpu")
    if args.format == "onnx":
        return classifier.save_pretrained(args.out, "onnx"), "an ONNX (model.onnx, onnxruntime)"
    written = classifier.save_pretrained(args.out, "hf", truncation=args.truncation)
    return (
        written,
        "a Hugging Face BERT (BertForSequenceClassification: AutoModelForSequenceClassification, pipeline)",
    )


def _export_masked_lm(args: argparse.Namespace) -> tuple[object, str]:
    from scratchformer.tasks.masked_lm import export_masked_lm

    what = {
        "hf": "a Hugging Face BERT (BertForMaskedLM, AutoModel)",
        "onnx": "an ONNX (model.onnx, onnxruntime)",
    }
    return export_masked_lm(args.checkpoint, args.out, args.format), what[args.format]


def _export_sentence_encoder(args: argparse.Namespace) -> tuple[object, str]:
    from scratchformer.tasks.sentence_embedding import SentenceEncoder

    written = SentenceEncoder.from_pretrained(args.checkpoint).save_onnx(args.out)
    return written, "an ONNX (model.onnx: sentence_embedding, onnxruntime)"


_EXPORTERS = {
    "translation": _export_translation,
    "text_classifier": _export_classifier,
    "masked_lm": _export_masked_lm,
    "embedding": _export_sentence_encoder,
}


def add_attention(sub: argparse._SubParsersAction) -> None:
    attention = sub.add_parser(
        "attention", help="PNG heatmaps of a translation model's attention for one sentence"
    )
    attention.add_argument("--checkpoint", required=True)
    attention.add_argument("text")
    attention.add_argument("--out", type=out_path, default="attention", help="output directory for the PNGs")
    attention.add_argument("--beam", type=positive, default=5)
    attention.set_defaults(func=_attention)


def _attention(args: argparse.Namespace) -> int:
    require_checkpoint(args.checkpoint)  # a missing path: named before torch is imported

    from scratchformer.tasks.translation import load_translator, translation_attention_maps

    translation, written = translation_attention_maps(
        load_translator(args.checkpoint, device="cpu"), args.text, args.out, beam_size=args.beam
    )
    print(f"translation: {translation}")
    print("\n".join(str(p) for p in written))
    return 0
