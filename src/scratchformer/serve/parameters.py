"""What a request may ask: the range of every request parameter (:data:`RANGES`; the Serve guide's
table), so that no value a client sends can overflow, exhaust memory or divide by zero in a model;
texts that are valid Unicode; and :class:`RequestError`, which a refused request raises with its
HTTP status and a one-line message naming the problem."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_BEAMS", "RANGES", "Range", "RequestError", "check_text", "shown", "token_ranges"]


class RequestError(ValueError):
    """A request the server refuses: its HTTP ``status`` (400 to 504) and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


MAX_BEAMS = 16  # beams (or samples) per input: each is a row of the batch, with its memory and time


@dataclass(frozen=True)
class Range:
    """The values a request parameter may take: ``low`` to ``high`` (``integer``: whole numbers
    only; ``above``: ``low`` itself excluded); ``why``: what sets the bound, for the error."""

    low: float
    high: float
    integer: bool = False
    above: bool = False
    why: str = ""

    def admits(self, value: Any) -> bool:
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
        return (self.low < value if self.above else self.low <= value) and value <= self.high

    def check(self, name: str, value: Any) -> None:
        """422 naming ``parameters.NAME`` and this range unless it admits ``value``."""
        if not self.admits(value):
            why = f" ({self.why})" if self.why else ""
            raise RequestError(422, f"parameters.{name} must be {self}{why}, got {shown(value)}")

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} {'>' if self.above else '>='} {_number(self.low)} and <= {_number(self.high)}"


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def shown(value: Any, most: int = 40) -> str:
    """A value as an error message shows it: its repr, cut to ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


RANGES: dict[str, Range] = {
    "num_beams": Range(1, MAX_BEAMS, integer=True),
    "num_return_sequences": Range(1, MAX_BEAMS, integer=True),
    "max_len_a": Range(0, 100),
    "max_len_b": Range(0, 100_000, integer=True),
    "length_penalty": Range(-10, 10),
    "temperature": Range(0.01, 100),
    "top_k": Range(0, 1_000_000, integer=True),
    "top_p": Range(0, 1, above=True),
    "repetition_penalty": Range(0.01, 100),
    "no_repeat_ngram_size": Range(0, 100, integer=True),
    "seed": Range(0, 2**63 - 1, integer=True),
}
"""The range of every numeric request parameter but the two the server's ``max_new_tokens`` limit
bounds (:func:`token_ranges`): wide enough for any decoding worth asking for, narrow enough that
scores stay finite (``length ** length_penalty``, ``logits / temperature``, a penalty's product),
beams fit in memory and a seed fits torch's generator (``seed + j`` for sample j)."""


def token_ranges(limit: int) -> dict[str, Range]:
    """``max_new_tokens`` and ``min_new_tokens`` under the server's ``max_new_tokens`` limit."""
    why = f"the server's limit max_new_tokens={limit}"
    return {
        "max_new_tokens": Range(1, limit, integer=True, why=why),
        "min_new_tokens": Range(0, limit - 1, integer=True, why=f"below {why}"),
    }


def check_text(text: str, where: str) -> None:
    """422 for a text that is not valid Unicode: a lone surrogate, which JSON's ``\\ud800`` spells."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(
            422, f"{where}: not valid Unicode (a lone surrogate {text[e.start]!r} at character {e.start})"
        ) from None
