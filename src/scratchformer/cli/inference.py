"""The commands that run a trained model on new input: ``translate``, ``caption``, ``classify``,
``embed`` and ``similarity``; each command's parser sits beside the function that runs it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from scratchformer.cli.options import (
    add_generation_options,
    add_precision_option,
    generation_options,
    positive,
    precision_autocast,
    print_outputs,
    resolve_precision,
)
from scratchformer.cli.paths import require_checkpoint, require_model_dir

__all__ = ["add_caption", "add_classify", "add_embed", "add_similarity", "add_translate"]


# ------------------------------------------------------------------------------------------------ translate


def add_translate(sub: argparse._SubParsersAction) -> None:
    translate = sub.add_parser(
        "translate", help="translate stdin to stdout, one sentence per line (streaming)"
    )
    translate.add_argument(
        "--checkpoint",
        required=True,
        action="append",
        help="our translation checkpoint, or a Hugging Face "
        "Marian or Pegasus directory (opus-mt: config.json, model.safetensors, source.spm, target.spm, "
        "vocab.json; our --format hf export); repeat it to translate with an ensemble (mean "
        "log-probabilities; the models must share the tokenizer)",
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
    add_precision_option(
        translate,
        ("fp32", "bf16", "int8"),
        " (bf16: bf16 weights; int8: linear layers, dynamic quantization, CPU)",
    )
    _add_errors_option(translate)
    translate.add_argument("text", nargs="?", help="one sentence (default: lines of stdin)")
    translate.set_defaults(func=_translate)


def _translate(args: argparse.Namespace) -> int:
    options = generation_options(args)
    for checkpoint in args.checkpoint:
        require_checkpoint(checkpoint)  # the checks so far need no torch; the work below does

    from scratchformer.formats.hf_bert import refuse_engine_export
    from scratchformer.tasks.translation import load_translator, read_lines

    for checkpoint in args.checkpoint:
        refuse_engine_export(checkpoint)  # an ONNX or CTranslate2 export: say how to run it
    translator = load_translator(args.checkpoint, device=args.device)
    translator = translator.with_precision(resolve_precision(args.precision, translator.device))
    config = translator.generation_config(**options)
    if args.prefix:
        _warn_unknown("--prefix pieces", translator.unknown_prefix_pieces(args.prefix))
    interactive = not args.text and getattr(sys.stdin, "isatty", lambda: False)()
    buffer = args.buffer_size or (1 if interactive else args.batch_size)
    limit, lengths, index = translator.model.config.max_len, [], 0
    for chunk in read_lines(_input_lines([args.text] if args.text else None, args.errors), buffer):
        texts = [text.strip() for text, problem in chunk if problem is None]
        sizes = translator.source_lengths(texts) if texts else []
        results = iter(
            translator.generate(texts, config, prefix=args.prefix, seed=args.seed, batch_size=args.batch_size)
            if texts
            else []
        )
        lengths += sizes
        sizes_left = iter(sizes)
        for source, problem in chunk:
            plain = f"{index}\t" if config.num_return_sequences > 1 else ""
            if problem is not None:
                _print_flagged({"source": source, "translation_text": None}, problem, args.json, plain)
            else:
                first = {"source": source.strip(), **_truncated(next(sizes_left), limit)}
                print_outputs("translation_text", next(results), first, args.json, plain)
            index += 1
        sys.stdout.flush()
    _report_truncated(lengths, limit)
    return 0


# ------------------------------------------------------------------------------------------------ caption


def add_caption(sub: argparse._SubParsersAction) -> None:
    caption = sub.add_parser("caption", help="caption image files with a captioning checkpoint")
    caption.add_argument(
        "--checkpoint",
        required=True,
        action="append",
        help="a captioning checkpoint; repeat it to caption with an ensemble (mean log-probabilities)",
    )
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
    add_precision_option(caption, ("fp32", "bf16"), " (autocast)")
    caption.set_defaults(func=_caption)


def _caption(args: argparse.Namespace) -> int:
    options = generation_options(args)
    for checkpoint in args.checkpoint:
        require_checkpoint(checkpoint)  # the checks so far need no torch; the work below does

    from pathlib import Path

    import torch

    from scratchformer.data.captions import UNK, tokenize_caption
    from scratchformer.formats.hf_bert import refuse_engine_export
    from scratchformer.tasks.captioning.ensemble import load_ensemble

    for checkpoint in args.checkpoint:
        refuse_engine_export(checkpoint)
    if args.attention_png and len(args.checkpoint) > 1:
        raise ValueError("--attention-png draws one model's attention: give one --checkpoint")
    captioner = load_ensemble(args.checkpoint, device=args.device)
    if args.prefix:  # words the vocabulary lacks would be forced as <UNK>
        words = tokenize_caption(args.prefix)
        _warn_unknown(
            "--prefix words", [w for w in words if w not in captioner.vocab.index and w != UNK.lower()]
        )
    photos = None
    if captioner.photos is not None:  # real photographs: any size, through the image encoder
        images, photos = captioner.photo_features(args.images)
    else:  # a bad image is a ValueError or OSError naming it: `error: ...`, exit code 2
        images = torch.stack([captioner.load_image(p, resize=args.resize) for p in args.images])
    with precision_autocast(captioner.device, resolve_precision(args.precision, captioner.device)):
        results = captioner.generate(
            images, captioner.generation_config(**options), prefix=args.prefix, seed=args.seed
        )
    for path, outputs in zip(args.images, results):
        print_outputs("generated_text", outputs, {"image": str(path)}, args.json, f"{path}\t")
    if args.attention_png:
        out = Path(args.attention_png)
        for i, image in enumerate(images):
            target = out if len(images) == 1 else out.with_name(f"{out.stem}-{i}{out.suffix}")
            captioner.plot_attention(
                image, target, photo=None if photos is None else photos[i], caption=results[i][0].text
            )
            print(f"attention: {target}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------------ classify


def add_classify(sub: argparse._SubParsersAction) -> None:
    classify = sub.add_parser("classify", help="label texts with a classifier checkpoint")
    classify.add_argument(
        "--checkpoint",
        required=True,
        help="our classifier checkpoint, its Hugging Face export, or any Hugging Face "
        "BertForSequenceClassification directory (config.json, model.safetensors, tokenizer.json)",
    )
    classify.add_argument("texts", nargs="*", help="texts (default: one per line on stdin)")
    classify.add_argument("--batch-size", type=positive, default=64)
    classify.add_argument("--device", default="auto")
    add_precision_option(classify, ("fp32", "bf16"), " (autocast)")
    classify.add_argument(
        "--json",
        action="store_true",
        help='one {"text", "label", "score"} per line ("truncated": true if it was cut)',
    )
    _add_errors_option(classify)
    classify.set_defaults(func=_classify)


def _classify(args: argparse.Namespace) -> int:
    import json

    lines = list(_input_lines(args.texts, args.errors))  # read (and checked) before the model loads
    require_checkpoint(args.checkpoint)  # the checks so far need no torch; the work below does

    from scratchformer.tasks.classification import load_classifier

    clf = load_classifier(args.checkpoint, device=args.device)
    texts = [text for text, problem in lines if problem is None]
    lengths = clf.tokenizer.full_lengths(texts) if texts else []
    precision = resolve_precision(args.precision, clf.device)
    answers = iter(zip(clf.predict(texts, args.batch_size, precision), lengths) if texts else [])
    for text, problem in lines:
        if problem is not None:
            _print_flagged({"text": text, "label": None, "score": None}, problem, args.json)
            continue
        (label, prob), n = next(answers)
        print(
            json.dumps(
                {"text": text, "label": label, "score": prob, **_truncated(n, clf.tokenizer.max_length)},
                ensure_ascii=False,
            )
            if args.json
            else f"{label}\t{prob:.4f}\t{text}"
        )
    _report_truncated(lengths, clf.tokenizer.max_length)
    return 0


# ------------------------------------------------------------------------------------------ embed, similarity


def add_embed(sub: argparse._SubParsersAction) -> None:
    embed = sub.add_parser(
        "embed", help="sentence embeddings from a BERT-family checkpoint (our BERT exports too)"
    )
    _add_model_argument(embed)
    embed.add_argument("texts", nargs="*", help="texts to embed (default: one per line on stdin)")
    embed.add_argument(
        "--json",
        action="store_true",
        help='one {"text": ..., "embedding": [...]} per line ("truncated": true if it was cut)',
    )
    embed.add_argument("--batch-size", type=positive, default=32)
    _add_errors_option(embed)
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
        help="BERT-family checkpoint directory (config.json, model.safetensors, tokenizer.json; our "
        "masked-LM and classifier exports too); default $SCRATCHFORMER_MODEL, else all-MiniLM-L6-v2 "
        "from the 'pretrained' extra",
    )


def _sentence_encoder(args: argparse.Namespace):
    given = args.model or os.environ.get("SCRATCHFORMER_MODEL")
    if given:
        require_model_dir(given)  # the checks so far need no torch; the work below does

    from scratchformer.formats.hf_bert import default_model_dir
    from scratchformer.tasks.sentence_embedding import SentenceEncoder

    model = args.model or default_model_dir()
    if model is None:
        raise ValueError(
            "--model DIR is required (or set SCRATCHFORMER_MODEL, or pip install -e '.[pretrained]')"
        )
    return SentenceEncoder.from_pretrained(model)


def _embed(args: argparse.Namespace) -> int:
    import json

    lines = list(_input_lines(args.texts, args.errors))  # read (and checked) before the model loads
    encoder = _sentence_encoder(args)
    texts = [text for text, problem in lines if problem is None]
    lengths = encoder.tokenizer.full_lengths(texts) if texts else []
    vectors = iter(zip(encoder.encode(texts, batch_size=args.batch_size).tolist(), lengths) if texts else [])
    for text, problem in lines:
        if problem is not None:
            _print_flagged({"text": text, "embedding": None}, problem, args.json)
            continue
        vector, n = next(vectors)
        print(
            json.dumps(
                {"text": text, "embedding": vector, **_truncated(n, encoder.tokenizer.max_length)},
                ensure_ascii=False,
            )
            if args.json
            else " ".join(f"{x:.6f}" for x in vector)
        )
    _report_truncated(lengths, encoder.tokenizer.max_length)
    return 0


def _similarity(args: argparse.Namespace) -> int:
    import json

    encoder = _sentence_encoder(args)
    _report_truncated(encoder.tokenizer.full_lengths([args.a, args.b]), encoder.tokenizer.max_length)
    score = encoder.similarity(args.a, args.b)
    print(
        json.dumps({"text_a": args.a, "text_b": args.b, "score": score}, ensure_ascii=False)
        if args.json
        else f"{score:.4f}"
    )
    return 0


# ------------------------------------------------------------------------------- lines in, lines out

EMPTY = "empty line"


def _add_errors_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--errors",
        choices=("fail", "skip"),
        default="fail",
        help="a stdin line that is not UTF-8: fail (an error naming the line and byte) or skip "
        '(its output line is empty; in JSON it has an "error"). Either way, one output line per input line',
    )


def _input_lines(texts: list[str] | None, errors: str = "fail") -> Iterator[tuple[str, str | None]]:
    """(text, problem) for each input: the ``texts`` given, else stdin's lines, read as bytes and
    decoded one by one, so a bad byte is named by its line and offset (as it is read: streaming); a
    UTF-8 byte-order mark before the first line is dropped, as a file's is (data/labelled_texts.py).
    problem: None; "empty line" (a blank line is answered by an empty one, never dropped); or why a
    line is not UTF-8 (--errors skip; fail raises a ValueError)."""
    if texts:
        for text in texts:
            yield text, EMPTY if not text.strip() else None
        return
    offset = 0  # bytes of stdin before this line
    for number, raw in enumerate(getattr(sys.stdin, "buffer", sys.stdin), 1):
        problem = None
        if isinstance(raw, bytes):
            try:
                raw_text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                problem = (
                    f"stdin line {number} is not UTF-8: byte {raw[e.start]:#04x} at offset {e.start} of "
                    f"the line ({offset + e.start} of the input)"
                )
                if errors == "fail":
                    raise ValueError(
                        f"{problem}; --errors skip answers such a line with an empty one"
                    ) from None
                raw_text = raw.decode("utf-8", errors="replace")
            offset += len(raw)
        else:  # a text stream (no .buffer), as tests give
            raw_text = raw
        if number == 1:  # a byte-order mark (Windows editors write one) is no part of the first text
            raw_text = raw_text.removeprefix("\ufeff")
        text = raw_text.removesuffix("\n").removesuffix("\r")
        yield text, problem or (EMPTY if not text.strip() else None)


def _print_flagged(first: dict, problem: str, as_json: bool, plain: str = "") -> None:
    """The output line of an input that got no answer: empty (plain), or the JSON with an "error"."""
    import json

    print(json.dumps({**first, "error": problem}, ensure_ascii=False) if as_json else plain)


def _report_truncated(lengths: list[int], limit: int) -> None:
    """Say (stderr) how many inputs were longer than the model takes and were cut."""
    cut = sum(n > limit for n in lengths)
    if cut:
        print(
            f"warning: {cut} of {len(lengths)} inputs were longer than {limit} tokens "
            f"and were cut to {limit}",
            file=sys.stderr,
        )


def _truncated(length: int, limit: int) -> dict[str, bool]:
    """The JSON field of an input cut to ``limit`` tokens: {"truncated": true}; none if it was not."""
    return {"truncated": True} if length > limit else {}


def _warn_unknown(what: str, unknown: list[str]) -> None:
    """Say (stderr) which words of a prefix the model's vocabulary lacks (each is forced as <unk>)."""
    if unknown:
        names = ", ".join(repr(w) for w in dict.fromkeys(unknown))
        print(f"warning: {what} not in the model's vocabulary become <unk>: {names}", file=sys.stderr)
