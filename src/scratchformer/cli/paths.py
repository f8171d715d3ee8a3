"""Checks of the paths a command is given, before any work starts and with the standard library only
(a refusal must not wait for torch): outputs never overwrite inputs (:func:`refuse_output_over_input`),
and a checkpoint, model directory or recipe that is not there is named with the message its loader
would give (:func:`require_checkpoint`, :func:`require_model_dir`, :func:`require_recipe`)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["refuse_output_over_input", "require_checkpoint", "require_model_dir", "require_recipe"]


def _same(output: Path, given: Path) -> bool:
    """Whether ``output`` is the file or folder ``given`` (the same path once links are resolved, or,
    a hard link, the same file on disk), or an existing file inside the folder ``given``."""
    if output.resolve() == given.resolve():
        return True
    if given.is_dir() and output.is_file() and output.resolve().is_relative_to(given.resolve()):
        return True
    try:
        return os.path.samefile(output, given)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def refuse_output_over_input(
    outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None | Iterable[str | Path]]
) -> None:
    """Raise a ValueError if an output (flag -> path; None: not given) resolves to an input (flag ->
    path, or several paths; None: not given): the same path, a symbolic link to it, a hard link of
    it, or, for an input folder, a file already in it (new files there are fine). Writing there would
    destroy what the command reads."""
    given = {
        flag: [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
        for flag, paths in inputs.items()
        if paths is not None
    }
    for out_flag, out in outputs.items():
        if out is None:
            continue
        for in_flag, paths in given.items():
            hit = next((p for p in paths if _same(Path(out), p)), None)
            if hit is not None:
                raise ValueError(
                    f"{out_flag} {out} is (or is in) the input {in_flag} {hit}: writing it would "
                    "destroy what is read; "
                    "choose another output path"
                )


def require_checkpoint(path: str | Path) -> None:
    """A FileNotFoundError if nothing is at ``path``, nor a checkpoint at ``path.old`` (where an
    interrupted save leaves one): the message of training.checkpoint.resolve_checkpoint, which every
    loader of a checkpoint (ours, Marian, BERT) reaches for a missing path. Anything that exists is
    left to the loaders."""
    path = Path(path)
    if not path.exists() and not (path.with_name(path.name + ".old") / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected config.json and model.safetensors there)")


def require_model_dir(path: str | Path) -> None:
    """A FileNotFoundError if nothing is at ``path`` (``--model`` of embed and similarity): the message
    of SentenceEncoder.from_pretrained for a missing directory."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory not found: {path}")


def require_recipe(path: str | Path) -> None:
    """A FileNotFoundError if nothing is at ``path`` (``train --config``): the one reading the recipe
    would raise (``[Errno 2] No such file or directory: 'PATH'``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
