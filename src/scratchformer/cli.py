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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
