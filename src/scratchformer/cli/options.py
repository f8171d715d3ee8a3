"""What several commands share: argparse types, the decoding flags of translate, caption and
evaluate, the printing of their outputs, and the kind of a checkpoint."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

__all__ = [
    "add_generation_options",
    "add_progress_option",
    "add_threads_option",
    "check_common_flags",
    "check_device",
    "generation_options",
    "non_negative",
    "positive",
    "print_outputs",
    "seed",
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


MAX_SEED = 2**63 - 1  # torch's generators take 64-bit seeds; the runs add small offsets to them


def seed(text: str) -> int:
    """argparse type: a random seed, an integer in [0, 2**63 - 1] (``1e23`` or ``10**30`` are refused
    here, not as an OverflowError deep in torch)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63 - 1], got {value}")
    return value


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's CPU threads; the default (and 0) leaves torch's own choice. Negative
    values are refused by the parser."""
    parser.add_argument(
        "--threads",
        type=non_negative,
        default=None,
        help="torch CPU threads (default or 0: torch's choice)",
    )


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bar (logs, CI); the command reads ``args.no_progress``."""
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


# Flags that contradict each other, whichever command has them: (flag, flag, why).
_EXCLUSIVE_FLAGS = [
    (
        "resume",
        "overwrite",
        "--resume continues the run in OUT and --overwrite replaces it: give one of them",
    ),
]


def check_common_flags(args: argparse.Namespace) -> None:
    """What ``main`` checks of every command before it runs: no contradicting flags together, and a
    ``--device`` that names a device of this machine."""
    for first, second, why in _EXCLUSIVE_FLAGS:
        if getattr(args, first, None) and getattr(args, second, None):
            raise ValueError(why)
    check_device(getattr(args, "device", None))


# What torch.device reads, checked here without importing torch: a type, then optionally ":" and an
# index (0, or digits with no leading zero; a C int), and the types torch names (its "Expected one
# of ..." list). tests/cli/test_fast_cli.py checks both against torch.device.
_DEVICE_STRING = re.compile(r"([a-zA-Z_]+)(?::(0|[1-9][0-9]*))?")
TORCH_DEVICE_TYPES = frozenset(
    "cpu cuda ipu xpu mkldnn opengl opencl ideep hip ve fpga maia xla lazy vulkan mps meta hpu mtia "
    "privateuseone".split()
)


def check_device(name: str | None) -> None:
    """``--device``: auto (or not given), cpu, cuda, cuda:N or mps, and one this machine has; else a
    ValueError naming it (not a RuntimeError from deep inside torch once the model is loaded). Only
    cuda and mps import torch, to ask it whether the machine has them."""
    if name is None or name == "auto":
        return
    match = _DEVICE_STRING.fullmatch(name)
    if match is None or match[1] not in TORCH_DEVICE_TYPES or int(match[2] or 0) >= 2**31:
        raise ValueError(f"--device {name!r}: not a device (auto, cpu, cuda, cuda:N or mps)")
    if match[1] not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {name!r}: not supported (auto, cpu, cuda, cuda:N or mps)")
    if match[1] == "cpu":
        return
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):  # what the pattern above lets through and torch refuses
        raise ValueError(f"--device {name!r}: not a device (auto, cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ValueError(f"--device {name!r}: CUDA is not available on this machine (use cpu or auto)")
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"--device {name!r}: this machine has {count} CUDA device(s), cuda:0..{count - 1}"
            )
    elif not torch.backends.mps.is_available():
        raise ValueError(f"--device {name!r}: Apple's MPS is not available on this machine")


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


def add_precision_option(parser: argparse.ArgumentParser, choices: tuple[str, ...], more: str = "") -> None:
    """``--precision``, by default "fp32": the same answers on every CPU and for any batch, as
    Hugging Face pipelines and CTranslate2's ``compute_type="default"`` give. bf16, int8 and "auto"
    (bf16 where the device computes it natively) are faster and close, not equal: opt-in."""
    parser.add_argument(
        "--precision",
        choices=[*choices, "auto"],
        default="fp32",
        help=f"{choices[0]} (default: the same answers on every CPU), {', '.join(choices[1:])}{more}, "
        "auto (bf16 where the device computes it natively, AMX or AVX512_BF16 on a CPU, else fp32)",
    )


def resolve_precision(precision: str, device) -> str:
    """The precision ``--precision`` means on ``device`` ("auto" resolved); an explicit bf16 that
    the device would emulate, many times slower than fp32, is warned about on stderr first."""
    from scratchformer.training.precision import bf16_warning
    from scratchformer.training.precision import resolve_precision as resolve

    warning = bf16_warning(precision, device)
    if warning:
        print(warning, file=sys.stderr)
    return resolve(precision, device) if precision == "auto" else precision


def precision_autocast(device, precision: str):
    """Inference under a resolved ``precision`` (bf16: autocast, as a classifier's): evaluate's
    translation and captioning, and caption."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


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
        "--seed", type=seed, default=None, help="sampling: reproducible samples (the same in any batch)"
    )
    g.add_argument(
        "--prefix", default=None, help="every output starts with this text (its tokens are forced)"
    )


def generation_options(args: argparse.Namespace) -> dict:
    """The generation flags given, as GenerationConfig fields; checked here, before any loading."""
    config_class = _generation_config_class()  # GenerationConfig
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
    config_class(**{"num_beams": options.get("num_return_sequences", 1), **options})
    return options


def _generation_config_class() -> type:
    """GenerationConfig, to check the decoding flags before torch is imported. Its module,
    generation/config.py, needs the standard library only, but importing it runs generation's
    ``__init__``, which imports the decoders and torch: unless the package is loaded already, the file
    is read on its own under a private name. That class only checks the flags; the decoding later
    uses the package's own."""
    loaded = sys.modules.get("scratchformer.generation.config")
    if loaded is not None:
        return loaded.GenerationConfig
    name = "scratchformer.cli._generation_config"
    path = Path(__file__).resolve().parent.parent / "generation" / "config.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses reads the module of a class it builds
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module.GenerationConfig


def print_outputs(key: str, outputs: list, first: dict, as_json: bool, plain_prefix: str) -> None:
    """One input's outputs: a JSON line ({first..., key: best text, score, log_prob, tokens, nbest}), or
    the best text, or (n-best) ``plain_prefix rank<TAB>score<TAB>text`` lines."""
    import json

    best = outputs[0]
    if as_json:
        from scratchformer.tasks.shared import generated_answer

        print(json.dumps(generated_answer(key, outputs, first), ensure_ascii=False))
    elif len(outputs) == 1:
        print(f"{plain_prefix}{_one_line(best.text)}")
    else:
        for rank, o in enumerate(outputs):
            print(f"{plain_prefix}{rank}\t{o.score:.4f}\t{_one_line(o.text)}")


def _one_line(text: str) -> str:
    """Plain output is one line per answer: a line break inside one (sampling can draw it) becomes a space."""
    return " ".join(text.splitlines())
