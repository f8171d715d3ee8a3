"""(inference thread) A generating model's inputs decoded by continuous batching
(:class:`Session`): what the batcher's running search is, served."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from scratchformer.tasks.shared import DecodingSession, generated_answer

if TYPE_CHECKING:
    from scratchformer.serve.served import ServedModel

__all__ = ["Session"]


class Session:
    """(inference thread) A generating model's inputs decoded by continuous batching: they join its
    running search between steps, under a tag each, and each answer (the fields of :meth:`ServedModel.
    run`'s) is ready at the step its input finishes."""

    def __init__(self, model: ServedModel, decoding: DecodingSession):
        self.model, self.decoding = model, decoding
        self.first: dict[Any, dict[str, Any]] = {}

    @property
    def live(self) -> int:
        return self.decoding.live

    @property
    def tags(self) -> list[Any]:
        return self.decoding.tags

    def join(self, tags: Sequence[Any], items: Sequence[Any]) -> None:
        """Inputs ``items`` join under ``tags``, decoded from the next step."""
        with self.model.decoding():
            self.decoding.join(self.model.model_inputs(items), tags)
        self.first.update((tag, self.model.first_fields(item)) for tag, item in zip(tags, items))

    def step(self) -> list[tuple[Any, dict[str, Any]]]:
        """One step of every live input: the answers of those that finished at it."""
        with self.model.decoding():
            finished = self.decoding.step()
        key = self.model.output_key
        return [(tag, generated_answer(key, outputs, self.first.pop(tag))) for tag, outputs in finished]

    def cancel(self, tags: Sequence[Any]) -> None:
        """Stop decoding these inputs (their requests are gone)."""
        self.decoding.cancel(tags)
        for tag in tags:
            self.first.pop(tag, None)
