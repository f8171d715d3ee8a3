"""Outputs never overwrite inputs: :func:`refuse_output_over_input`, which every command that writes
a file next to what it reads can call before any work starts."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["refuse_output_over_input"]


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
