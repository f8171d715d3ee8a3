"""The ``scratchformer`` command line, a thin layer over the Python API.

One module per concern, each command's parser beside the function that runs it:

    train.py      train classifier | translation | mlm | captioner
    inference.py  translate, caption, classify, embed, similarity
    evaluate.py   evaluate (a classifier, a translator or a captioner)
    tools.py      demo, features, shapes, export, attention
    options.py    what several commands share: integer types, the decoding flags, output lines
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scratchformer.cli import evaluate, inference, tools, train

__all__ = ["build_parser", "main"]

# The subcommands, in the order ``--help`` and the command line reference list them.
_COMMANDS = [
    tools.add_demo,
    inference.add_embed,
    inference.add_similarity,
    train.add_train,
    inference.add_caption,
    tools.add_features,
    tools.add_shapes,
    inference.add_translate,
    tools.add_export,
    tools.add_attention,
    evaluate.add_evaluate,
    inference.add_classify,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scratchformer",
        description="The Transformer of 'Attention Is All You Need', from scratch in PyTorch.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (anywhere on the line; or SCRATCHFORMER_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in _COMMANDS:
        add_command(sub)
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
    except Exception as e:  # every error becomes one line (the traceback behind --debug)
        if args.debug or os.environ.get("SCRATCHFORMER_DEBUG"):
            raise
        message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        print(
            f"error: {message}"
            + (
                ""
                if isinstance(e, (ValueError, TypeError, OSError))
                else f" ({type(e).__name__}; --debug for the traceback)"
            ),
            file=sys.stderr,
        )
        return 2
    if args.command == "train":
        from scratchformer.training import distributed

        distributed.destroy()  # leave the process group (no-op in a single process)
    return code
