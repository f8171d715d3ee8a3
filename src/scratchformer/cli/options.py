"""What several commands share: argparse types, the decoding flags of translate, caption and
evaluate, the printing of their outputs, and the kind of a checkpoint."""

from __future__ import annotations

import argparse

__all__ = [
    "add_generation_options",
    "checkpoint_kind",
    "generation_options",
    "non_negative",
    "positive",
    "print_outputs",
]


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_GENERATION_FLAGS = {
    "beam": "num_beams",
    "nbest": "num_return_sequences",
    "lenpen": "length_penalty",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "no_repeat_ngram": "no_repeat_ngram_size",
    "repetition_penalty": "repetition_penalty",
    "min_len": "min_new_tokens",
}


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """The decoding flags of translate, caption and evaluate; unset ones keep the recipe's ``decoding``."""
    g = parser.add_argument_group("generation (default: the recipe's decoding section)")
    g.add_argument("--beam", type=positive, default=None, help="beam size (1 = greedy)")
    g.add_argument(
        "--nbest", type=positive, default=None, help="outputs per input: the n best of the beam, or n samples"
    )
    g.add_argument(
        "--lenpen", type=float, default=None, help="length penalty: score = log p / length ** lenpen"
    )
    g.add_argument(
        "--max-len-a",
        type=float,
        default=None,
        help="at most a * S + b new tokens (S: padded source "
        "length; captioning: image regions, so use --max-new-tokens)",
    )
    g.add_argument("--max-len-b", type=non_negative, default=None)
    g.add_argument(
        "--max-new-tokens", type=positive, default=None, help="at most this many new tokens (instead of a, b)"
    )
    g.add_argument(
        "--sampling", action="store_true", help="sample each token instead of beam or greedy search"
    )
    g.add_argument("--temperature", type=float, default=None, help="sampling: logits / temperature")
    g.add_argument(
        "--top-k", type=non_negative, default=None, help="sampling: among the k most likely tokens (0 = all)"
    )
    g.add_argument("--top-p", type=float, default=None, help="sampling: nucleus, in (0, 1]")
    g.add_argument("--no-repeat-ngram", type=non_negative, default=None, help="no n-gram of this size twice")
    g.add_argument(
        "--repetition-penalty", type=float, default=None, help="CTRL's penalty on repeated tokens (1 = off)"
    )
    g.add_argument(
        "--min-len", type=non_negative, default=None, help="no end of sentence before this many tokens"
    )
    g.add_argument(
        "--seed", type=int, default=None, help="sampling: reproducible samples (the same in any batch)"
    )
    g.add_argument(
        "--prefix", default=None, help="every output starts with this text (its tokens are forced)"
    )


def generation_options(args: argparse.Namespace) -> dict:
    """The generation flags given, as GenerationConfig fields; checked here, before any loading."""
    from scratchformer.generation import GenerationConfig

    options = {
        field: getattr(args, flag)
        for flag, field in _GENERATION_FLAGS.items()
        if getattr(args, flag) is not None
    }
    sampling_only = [
        f"--{flag.replace('_', '-')}"
        for flag in ("temperature", "top_k", "top_p", "seed")
        if getattr(args, flag) is not None
    ]
    if sampling_only and not args.sampling:
        raise ValueError(f"{', '.join(sampling_only)}: only with --sampling")
    if args.sampling:
        options["do_sample"] = True
        options.setdefault("num_beams", 1)
    # An impossible combination is an error naming it, now (the recipe's beam size is not known yet).
    GenerationConfig(**{"num_beams": options.get("num_return_sequences", 1), **options})
    return options


def print_outputs(key: str, outputs: list, first: dict, as_json: bool, plain_prefix: str) -> None:
    """One input's outputs: a JSON line ({first..., key: best text, score, log_prob, tokens, nbest}), or
    the best text, or (n-best) ``plain_prefix rank<TAB>score<TAB>text`` lines."""
    import json

    best = outputs[0]
    if as_json:
        print(
            json.dumps(
                {
                    **first,
                    key: best.text,
                    "score": best.score,
                    "log_prob": best.log_prob,
                    "tokens": best.tokens,
                    "nbest": [o.to_dict() for o in outputs],
                },
                ensure_ascii=False,
            )
        )
    elif len(outputs) == 1:
        print(f"{plain_prefix}{_one_line(best.text)}")
    else:
        for rank, o in enumerate(outputs):
            print(f"{plain_prefix}{rank}\t{o.score:.4f}\t{_one_line(o.text)}")


def _one_line(text: str) -> str:
    """Plain output is one line per answer: a line break inside one (sampling can draw it) becomes a space."""
    return " ".join(text.splitlines())


def checkpoint_kind(checkpoint: str) -> str | None:
    """The "kind" a checkpoint's config.json records; a Hugging Face Marian directory is a translation
    model."""
    from scratchformer.models.marian import is_marian_dir
    from scratchformer.training.checkpoint import load_config, resolve_checkpoint

    return (
        "translation"
        if is_marian_dir(checkpoint)
        else load_config(resolve_checkpoint(checkpoint)).get("kind")
    )
