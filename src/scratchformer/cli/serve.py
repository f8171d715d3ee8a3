"""``scratchformer serve``: trained models behind HTTP (:mod:`scratchformer.serve`)."""

from __future__ import annotations

import argparse
import os

from scratchformer.cli.options import check_device, positive

__all__ = ["add_serve"]


def add_serve(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve checkpoints over HTTP: translate, classify, caption, embed; a web page at / (needs "
        "the 'serve' extra)",
    )
    serve.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="a checkpoint to serve (repeat for several): ours, our Hugging Face exports, the Hugging "
        "Face models we read (Marian, BERT classifiers, sentence-transformers); NAME: the folder's name",
    )
    serve.add_argument(
        "--config", help="a YAML file: models, host, port, threads, limits (flags override it)"
    )
    serve.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=positive, help="port (default 8000)")
    serve.add_argument("--threads", type=positive, help="torch's CPU threads, set once (default: torch's)")
    serve.add_argument("--device", help="cpu, cuda, ... (default cpu)")
    serve.add_argument(
        "--precision", choices=("fp32", "bf16", "int8"), default="fp32", help="of the --checkpoint models"
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("SCRATCHFORMER_API_KEY"),
        help="requests to /v1/ need 'Authorization: Bearer KEY' (default $SCRATCHFORMER_API_KEY; none: open)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        help="a browser origin allowed to call the API (repeat)",
    )
    serve.add_argument(
        "--drain",
        type=float,
        help="seconds /ready answers 503 after SIGTERM before the server stops (default 5)",
    )
    serve.add_argument(
        "--root-path",
        help="the path prefix a reverse proxy serves it under, e.g. /scratchformer (the proxy strips it; "
        "the page and /docs use it)",
    )
    serve.add_argument(
        "--batching",
        choices=("continuous", "whole"),
        help="continuous (default): an input joins a translator's or captioner's running decode at its "
        "next step; whole: each batch decodes to its end before the next starts",
    )
    serve.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one of the limits (repeat): max_batch_size, max_batch_tokens, max_wait_ms, max_queue, "
        "max_concurrency, max_body_bytes, max_items, max_input_tokens, max_new_tokens, max_image_pixels, "
        "timeout_s, max_head_bytes, head_timeout_s, body_timeout_s",
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from scratchformer.serve.config import ModelSpec, ServeConfig

    data: dict = {}
    if args.config:
        data = ServeConfig.from_file(args.config).__dict__.copy()
    data["models"] = [*data.get("models", []), *(ModelSpec.parse(t, args.precision) for t in args.checkpoint)]
    for name in ("host", "port", "threads", "device", "api_key", "root_path", "batching"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if args.drain is not None:
        data["drain_s"] = args.drain
    if args.cors_origin:
        data["cors_origins"] = args.cors_origin
    data["limits"] = _limits(data.get("limits"), args.limit)
    config = ServeConfig(**data)
    check_device(config.device)  # the config file's too

    from scratchformer.serve.server import run_server

    return run_server(config, debug=args.debug)


def _limits(base, given: list[str]):
    import dataclasses

    from scratchformer.serve.config import Limits

    values = dataclasses.asdict(base) if base is not None else {}
    fields = {f.name for f in dataclasses.fields(Limits)}
    for text in given:
        name, sep, value = text.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--limit {text!r}: expected NAME=VALUE with NAME one of {sorted(fields)}")
        values[name] = _number(value, text)
    return Limits(**values)


def _number(value: str, text: str) -> int | float:
    """``value`` as an integer if it is one, else as a float (Limits says which each limit takes)."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"--limit {text!r}: {value!r} is not a number") from None
