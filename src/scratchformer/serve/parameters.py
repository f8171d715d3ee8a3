"""What a request may ask of a model that decodes: :class:`GenerationParameters`, every decoding
parameter with its type and range, the one place the bounds are written (the OpenAPI document shows
them, FastAPI's validation enforces them, :data:`RANGES` and the Serve guide's table repeat them), so
that no value a client sends can overflow, exhaust memory or divide by zero in a model; and texts
that are valid Unicode."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from scratchformer.core.keys import unknown_keys
from scratchformer.serve.errors import RequestError

__all__ = [
    "MAX_BEAMS",
    "RANGES",
    "GenerationParameters",
    "Range",
    "check_text",
    "range_of",
    "shown",
    "token_ranges",
]

MAX_BEAMS = 16  # beams (or samples) per input: each is a row of the batch, with its memory and time


class GenerationParameters(BaseModel):
    """A request's decoding options: :class:`~scratchformer.generation.GenerationConfig`'s fields,
    ``seed`` and ``prefix``; what a request leaves out is the recipe's decoding. The bounds keep
    scores finite (``length ** length_penalty``, ``logits / temperature``, a penalty's product),
    beams in memory and a seed within torch's generator (``seed + j`` for sample j);
    ``max_new_tokens`` and ``min_new_tokens`` are also bounded by the server's limit
    (:func:`token_ranges`). Types are strict: ``true`` is no number, ``2.0`` no integer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    num_beams: int = Field(
        None, ge=1, le=MAX_BEAMS, description="1: greedy search or sampling (or beam_size)"
    )
    num_return_sequences: int = Field(None, ge=1, le=MAX_BEAMS, description="at most num_beams for beams")
    max_new_tokens: int | None = Field(
        None, ge=1, description="at most the server's limit max_new_tokens; null: max_len_a * S + max_len_b"
    )
    min_new_tokens: int = Field(None, ge=0, description="below the server's max_new_tokens and each budget")
    max_len_a: float = Field(None, ge=0, le=100, description="the budget max_len_a * S + max_len_b")
    max_len_b: int = Field(None, ge=0, le=100_000)
    length_penalty: float = Field(None, ge=-10, le=10, description="beams ranked by log_prob / length ** it")
    do_sample: bool = Field(None, description="draw each token instead of taking the best")
    temperature: float = Field(None, ge=0.01, le=100)
    top_k: int = Field(None, ge=0, le=1_000_000, description="0: every token")
    top_p: float = Field(None, gt=0, le=1)
    repetition_penalty: float = Field(None, ge=0.01, le=100, description="1: off")
    no_repeat_ngram_size: int = Field(None, ge=0, le=100, description="0: off")
    seed: int = Field(None, ge=0, le=2**63 - 1, description="only with do_sample")
    prefix: str = Field(None, description="the output's start; its tokens leave room within max_len")

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        """An unknown name is refused naming the known ones; ``beam_size`` is ``num_beams``."""
        if not isinstance(data, dict):
            raise PydanticCustomError("model_type", "expected a JSON object, got {got}", {"got": shown(data)})
        problem = unknown_keys(data, [*cls.model_fields, "beam_size"])
        if problem:
            raise PydanticCustomError("unknown_parameter", "{problem}", {"problem": problem})
        if "beam_size" in data:
            data = {**data, "num_beams": data["beam_size"]}
            del data["beam_size"]
        return data

    @field_validator("*", mode="wrap")
    @classmethod
    def _in_range(cls, value: Any, handler: Any, info: Any) -> Any:
        """A value of the wrong type or out of its range: "must be an integer >= 1 and <= 16, got 0"."""
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "must_be",
                "must be {allowed}, got {got}",
                {"allowed": _allowed(info.field_name), "got": shown(value)},
            ) from None

    def given(self) -> dict[str, Any]:
        """The parameters the request gave (``beam_size`` as ``num_beams``)."""
        return self.model_dump(exclude_unset=True)


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
        low = f"{kind} {'>' if self.above else '>='} {_number(self.low)}"
        return low if math.isinf(self.high) else f"{low} and <= {_number(self.high)}"


def range_of(name: str) -> Range | None:
    """The range :class:`GenerationParameters` declares for a numeric parameter (an open top:
    ``high`` infinite), or None for another one."""
    field = GenerationParameters.model_fields[name]
    bounds = {type(m): m for m in field.metadata}
    low = bounds.get(annotated_types.Ge) or bounds.get(annotated_types.Gt)
    if low is None:
        return None
    high = bounds.get(annotated_types.Le)
    above = isinstance(low, annotated_types.Gt)
    integer = int in (field.annotation, *getattr(field.annotation, "__args__", ()))
    return Range(low.gt if above else low.ge, high.le if high else math.inf, integer, above)


def _allowed(name: str) -> str:
    allowed = range_of(name)
    if allowed is not None:
        return str(allowed) + (" (or null)" if name == "max_new_tokens" else "")
    return {"do_sample": "true or false", "prefix": "a string"}[name]


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def shown(value: Any, most: int = 40) -> str:
    """A value as an error message shows it: its repr, cut to ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


RANGES: dict[str, Range] = {
    name: allowed
    for name in GenerationParameters.model_fields
    if (allowed := range_of(name)) is not None and not math.isinf(allowed.high)
}
"""The range of every numeric request parameter but the two the server's ``max_new_tokens`` limit
bounds (:func:`token_ranges`), as :class:`GenerationParameters` declares them."""


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
