"""What generation returns to a caller: one output (:class:`Generated`), an input's outputs as the
command line's JSON line, and the per-row step callback of a batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["Generated", "generated_answer", "rows_named"]


@dataclass
class Generated:
    """One output of a translator or captioner: its ``text``, ``tokens`` (without BOS and EOS), the
    summed ``log_prob`` and the length-normalised ``score`` (see
    :func:`~scratchformer.generation.generate`)."""

    text: str
    tokens: list[int]
    log_prob: float
    score: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def generated_answer(key: str, outputs: list[Generated], first: dict[str, Any]) -> dict[str, Any]:
    """One input's outputs as the command line's JSON line: ``first``, the best text under ``key``,
    its score, log-probability and tokens, and the n best."""
    best = outputs[0]
    return {
        **first,
        key: best.text,
        "score": best.score,
        "log_prob": best.log_prob,
        "tokens": best.tokens,
        "nbest": [o.to_dict() for o in outputs],
    }


def rows_named(
    on_step: Callable[[list[int], Tensor], None] | None, index: list[int], n: int
) -> Callable[[Tensor], None] | None:
    """A batch's step callback for :func:`~scratchformer.generation.generate` (its rows: the n
    outputs of each input, in ``index`` order) that tells ``on_step`` whose each row is: the
    input's position, ``index[row // n]``."""
    if on_step is None:
        return None
    rows = [i for i in index for _ in range(n)]
    return lambda tokens: on_step(rows, tokens)
