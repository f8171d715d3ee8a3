"""What more than one task uses: the label-smoothed loss of sequence training, id padding, the
checks of recipe sections, and what generation returns.
(A task never imports another task; what two share lives here or lower.)"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, get_type_hints

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.training.recipe import resolve_data_path

__all__ = ["Generated", "check_batch", "check_decoding", "check_files", "check_model_fields", "check_range", "label_smoothed_loss", "pad_ids"]


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> Tensor:
    """Cross-entropy with label smoothing (paper, 5.4: eps_ls = 0.1), averaged over non-pad tokens.

    logits (B, T, V), target (B, T): the target distribution puts 1 - eps on the gold token and
    eps spread uniformly over the vocabulary (PyTorch's ``label_smoothing``); padding positions
    contribute nothing.
    """
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=smoothing)


def pad_ids(sequences: Sequence[Sequence[int]], device: torch.device | str = "cpu", pad_id: int = 0) -> Tensor:
    """Token id lists of different lengths -> (B, L_max) long tensor, right-padded with ``pad_id``."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


class DecodingOptions(TypedDict, total=False):
    """The keys of a recipe's ``decoding`` section (and of a translation recipe's ``decoding_grid``),
    checked by :func:`check_decoding`; a key left out keeps the task's default."""

    beam_size: int  # hypotheses kept at each step, >= 1 (1: greedy search)
    length_penalty: float  # a hypothesis's score is log_prob / length ** length_penalty (finite)
    max_len_a: float  # at most max_len_a * S + max_len_b new tokens for a source of S tokens (>= 0),
    # within the model's max_len
    max_len_b: int  # the constant term of that limit (>= 0)


DECODING_KEYS: dict[str, type] = get_type_hints(DecodingOptions)  # key -> int or float


def check_decoding(decoding: dict[str, Any], allowed: tuple[str, ...] = tuple(DECODING_KEYS)) -> None:
    """A recipe's ``decoding`` section: known keys only, beam_size >= 1, finite numbers >= 0."""
    unknown = sorted(set(decoding) - set(allowed))
    if unknown:
        raise ValueError(f"decoding: unknown keys {unknown} (expected some of {list(allowed)})")
    for key, value in decoding.items():
        integer = DECODING_KEYS[key] is int
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
            raise ValueError(f"decoding.{key}: expected a finite {'integer' if integer else 'number'}, got {value!r}")
        low = {"beam_size": 1, "max_len_a": 0, "max_len_b": 0}.get(key)
        if low is not None and value < low:
            raise ValueError(f"decoding.{key} must be >= {low}, got {value!r}")


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


def check_model_fields(config_cls: type, fields: dict[str, Any], **filled: Any) -> None:
    """The recipe's ``model`` section builds a valid ``config_cls`` (with ``filled`` standing in for
    what the data decides later, e.g. the vocabulary size)."""
    try:
        config_cls(**{**fields, **filled})
    except TypeError as e:
        raise ValueError(f"model: {e}".replace(f"{config_cls.__name__}.__init__() ", "")) from None
    except ValueError as e:
        raise ValueError(f"model: {e}") from None


@dataclass
class Generated:
    """One output of a translator or captioner: its ``text``, ``tokens`` (without BOS and EOS), the
    summed ``log_prob`` and the length-normalised ``score`` (see :func:`~scratchformer.generation.generate`)."""

    text: str
    tokens: list[int]
    log_prob: float
    score: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
