"""The ``scratchformer`` command line, a thin layer over the Python API.

One module per concern, each command's parser beside the function that runs it:

    train.py      train classifier | translation | mlm | captioner
    inference.py  translate, caption, classify, embed, similarity
    evaluate.py   evaluate (a classifier, a translator or a captioner)
    tools.py      demo, features, shapes, export, attention
    serve.py      serve (the flags; the server is scratchformer.serve)
    options.py    what several commands share: integer types, the decoding flags, output lines
    paths.py      checks of the paths a command is given (missing inputs, outputs over inputs)

Building the parser and checking the arguments need the standard library only: each command
imports torch and the models inside the function that runs it, once its arguments are checked, so
that --help, --version and a refusal answer at once (tests/cli/test_fast_cli.py). With __main__.py
and the package's __init__.py it sits on top: it may import anything of the package.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scratchformer.cli import evaluate, inference, serve, tools, train
from scratchformer.cli.options import check_common_flags

__all__ = ["EXIT_BAD_INPUT", "EXIT_BUG", "EXIT_INTERRUPTED", "EXIT_OK", "build_parser", "main"]

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
    serve.add_serve,
]


# The exit codes of every command (docs/reference/cli.md shows this table).
EXIT_OK = 0  # done
EXIT_BUG = 1  # an unexpected exception: a bug in scratchformer (--debug shows the traceback)
EXIT_BAD_INPUT = 2  # bad input or usage: a bad flag, file, recipe, checkpoint or missing package, on one line
EXIT_INTERRUPTED = 130  # interrupted (Ctrl-C: KeyboardInterrupt), as a shell reports SIGINT


def build_parser() -> argparse.ArgumentParser:
    from scratchformer import __version__

    parser = argparse.ArgumentParser(
        prog="scratchformer",
        description="The Transformer of 'Attention Is All You Need', from scratch in PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"scratchformer {__version__}")
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

    Exit codes: 0 done; 2 bad input or usage (one line on stderr naming the problem: argparse's
    usage errors, and a ValueError, TypeError or OSError of the command, or an ImportError: a
    package the command needs is not installed, named with what to install); 130 interrupted (one
    line, "interrupted"); 1 an unexpected exception, a bug (one line, "--debug for the
    traceback"). ``--debug`` (or SCRATCHFORMER_DEBUG=1) shows the traceback instead of the line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args([a for a in argv if a != "--debug"])  # usage errors: exit 2
    args.debug = "--debug" in argv or bool(os.environ.get("SCRATCHFORMER_DEBUG"))
    try:
        check_common_flags(args)
        code = args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as e:  # a command's own "error: ..." exit is bad input too
        if isinstance(e.code, str):
            print(e.code if e.code.startswith("error:") else f"error: {e.code}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    except Exception as e:  # every error becomes one line (the traceback behind --debug)
        if args.debug:
            raise
        message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        if isinstance(e, (ValueError, TypeError, OSError, ImportError)):
            print(f"error: {message}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"error: {message} ({type(e).__name__}: a bug; --debug for the traceback)", file=sys.stderr)
        return EXIT_BUG
    if args.command == "train":
        from scratchformer.training import distributed

        distributed.destroy()  # leave the process group (no-op in a single process)
    return code
