"""A recipe's ``decoding`` section and ``decoding_grid``: their keys (:class:`DecodingOptions`), their
checks, and choosing the best combination of a grid on the validation set."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, TypedDict, get_type_hints

from scratchformer.core.keys import reject_unknown

__all__ = [
    "CAPTIONING_DECODING",
    "DECODING_KEYS",
    "TRANSLATION_DECODING",
    "DecodingOptions",
    "check_decoding",
    "check_decoding_grid",
    "choose_from_grid",
    "decoding_combinations",
]


class DecodingOptions(TypedDict, total=False):
    """The keys of a recipe's ``decoding`` section (and of a translation recipe's ``decoding_grid``),
    checked by :func:`check_decoding`; a key left out keeps the task's default."""

    beam_size: int  # hypotheses kept at each step, >= 1 (1: greedy search)
    length_penalty: float  # a hypothesis's score is log_prob / length ** length_penalty (finite)
    max_len_a: float  # at most max_len_a * S + max_len_b new tokens for a source of S tokens (>= 0),
    # within the model's max_len
    max_len_b: int  # the constant term of that limit (>= 0)
    no_repeat_ngram_size: int  # captioning: no n-gram of this size twice in a caption (0: off)
    min_new_tokens: int  # captioning: no end of the caption before this many words (0: off)


DECODING_KEYS: dict[str, type] = get_type_hints(DecodingOptions)  # key -> int or float
TRANSLATION_DECODING = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
CAPTIONING_DECODING = ("beam_size", "length_penalty", "no_repeat_ngram_size", "min_new_tokens")


def check_decoding(decoding: dict[str, Any], allowed: tuple[str, ...] = TRANSLATION_DECODING) -> None:
    """A recipe's ``decoding`` section: known keys only, beam_size >= 1, finite numbers >= 0."""
    reject_unknown(decoding, allowed, "decoding")
    for key, value in decoding.items():
        integer = DECODING_KEYS[key] is int
        if (
            isinstance(value, bool)
            or not isinstance(value, int if integer else (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(
                f"decoding.{key}: expected a finite {'integer' if integer else 'number'}, got {value!r}"
            )
        low = {"beam_size": 1, "max_len_a": 0, "max_len_b": 0, "no_repeat_ngram_size": 0, "min_new_tokens": 0}
        if key in low and value < low[key]:
            raise ValueError(f"decoding.{key} must be >= {low[key]}, got {value!r}")


def decoding_combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a ``decoding_grid``'s values:
    {"a": [1, 2], "b": [3]} -> [{"a": 1, "b": 3}, {"a": 2, "b": 3}]."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def choose_from_grid(
    decoding: dict[str, Any],
    grid: dict[str, list[Any]],
    score: Callable[[dict[str, Any]], dict[str, Any]],
    metric: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every combination of ``grid`` on top of ``decoding``, scored by ``score(full decoding)``;
    returns the decoding whose ``metric`` is highest (the first of equals) and each combination's
    options with its scores (a task's ``choose_decoding``)."""
    combinations = decoding_combinations(grid)
    trials = [{**options, **score({**decoding, **options})} for options in combinations]
    best = max(range(len(trials)), key=lambda i: (trials[i][metric], -i))
    return {**decoding, **combinations[best]}, trials


def check_decoding_grid(
    decoding: dict[str, Any], grid: Any, allowed: tuple[str, ...] = TRANSLATION_DECODING
) -> None:
    """A recipe's ``decoding_grid``: an object of non-empty lists, each combination on top of
    ``decoding`` a valid decoding section."""
    if not isinstance(grid, dict):
        raise ValueError(f"decoding_grid: expected an object of lists, got {grid!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"decoding_grid.{key}: expected a non-empty list of values, got {values!r}")
    for options in decoding_combinations(grid):
        check_decoding({**decoding, **options}, allowed)
