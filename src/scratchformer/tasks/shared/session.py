"""A task's inputs decoded by continuous batching: :class:`DecodingSession` puts a task's faces
(its inputs in, :class:`Generated` out) on a :class:`~scratchformer.generation.continuous.
ContinuousSearch`, for the server's inference thread (or any loop that takes inputs as they come)::

    session = translator.session(config)
    session.join(["Ein Hund.", "Zwei Katzen spielen."], tags=[0, 1])
    while session.live:
        for tag, outputs in session.step():   # the inputs that finished at this step
            print(tag, outputs[0].text)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from scratchformer.generation import hypotheses
from scratchformer.generation.continuous import ContinuousSearch, Tag
from scratchformer.tasks.shared.outputs import Generated

__all__ = ["DecodingSession"]


class DecodingSession:
    """Inputs that join a running search between steps and leave as they finish. ``inputs``:
    the task's inputs -> the model's (src (B, S), its padding mask or None); ``prefix``: the token
    ids every output starts with; ``output``: a hypothesis as the task's :class:`Generated`."""

    def __init__(
        self,
        search: ContinuousSearch,
        inputs: Callable[[Sequence[Any]], tuple[Tensor, Tensor | None]],
        prefix: list[int] | None,
        output: Callable[[hypotheses.Hypothesis], Generated],
    ):
        self.search, self.inputs, self.prefix, self.output = search, inputs, prefix, output

    @property
    def live(self) -> int:
        """The inputs decoding."""
        return self.search.live

    @property
    def tags(self) -> list[Tag]:
        """The tags of the inputs decoding, in joining order."""
        return self.search.tags

    def join(self, items: Sequence[Any], tags: Sequence[Tag]) -> None:
        """``items`` join under ``tags`` (one each): encoded now, decoded from the next step."""
        src, mask = self.inputs(items)
        prefix = None if not self.prefix else [self.prefix] * len(items)
        self.search.join(src, tags, prefix, mask)

    def step(self) -> list[tuple[Tag, list[Generated]]]:
        """One decoding step of every live input: those that finished, with their outputs."""
        return [(tag, [self.output(h) for h in hyps]) for tag, hyps in self.search.step()]

    def cancel(self, tags: Sequence[Tag]) -> None:
        """Stop decoding the inputs under ``tags``."""
        self.search.cancel(tags)
