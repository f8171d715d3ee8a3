"""Checks of a recipe before any work: integer ranges, the files it names, its ``model`` section,
and the batch and beam sizes of inference."""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path
from typing import Any

from scratchformer.core.keys import reject_unknown
from scratchformer.training.recipe import resolve_data_path

__all__ = ["check_batch", "check_files", "check_model_fields", "check_range"]


def _check_integer(name: str, value: Any, low: int) -> None:
    """``value`` is None or an integer (not a bool) >= ``low``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_batch(batch_size: int, beam_size: int | None = None) -> None:
    """Decoding/inference arguments: batch_size >= 1 and beam_size >= 1 (if given)."""
    _check_integer("batch_size", batch_size, 1)
    _check_integer("beam_size", beam_size, 1)


def check_range(recipe: object, at_least: dict[str, int], fractions: tuple[str, ...] = ()) -> None:
    """Integer fields of ``recipe`` must be >= their bound; ``fractions`` must be in [0, 1)."""
    for name, low in at_least.items():
        _check_integer(name, getattr(recipe, name), low)
    for name in fractions:
        value = getattr(recipe, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def check_files(data_dir: str | Path, kind: str = "data", **paths: str | None) -> None:
    """The ``kind`` files that recipe fields name (field=path; None: not used; ``{data}`` is
    ``data_dir``) exist: a run checks every input before any work starts, not after training."""
    for name, path in paths.items():
        resolved = resolve_data_path(path, data_dir)
        if resolved is not None and not Path(resolved).is_file():
            raise FileNotFoundError(f"{name}: {kind} file not found: {resolved}")


def check_model_fields(
    config_cls: type, fields: dict[str, Any], max_length: int | None = None, **filled: Any
) -> None:
    """The recipe's ``model`` section builds a valid ``config_cls`` (with ``filled`` standing in for
    what the data decides later, e.g. the vocabulary size): known keys only (an unknown one names the
    closest, as the recipe's own fields do). ``max_length``: the recipe's tokens per text, the
    section's ``max_len`` when it has none; a ``max_len`` shorter is refused here, not at the first
    long text once training has started."""
    reject_unknown(fields, [f.name for f in dataclasses.fields(config_cls)], "model")
    if max_length is not None:
        fields = {"max_len": max_length, **fields}
        if isinstance(fields["max_len"], int) and fields["max_len"] < max_length:
            raise ValueError(f"model.max_len={fields['max_len']} is shorter than max_length={max_length}")
    try:
        config_cls(**{**fields, **filled})
    except TypeError as e:
        raise ValueError(f"model: {e}".replace(f"{config_cls.__name__}.__init__() ", "")) from None
    except ValueError as e:
        raise ValueError(f"model: {e}") from None
