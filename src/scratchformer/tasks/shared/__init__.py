"""What more than one task uses, one concern a module (a task never imports another task; what two
share lives here or lower):

    run         the run every training task follows (:class:`TrainingRun`)
    sequences   id padding and the label-smoothed loss of sequence training
    checks      a recipe's checks before any work (ranges, files, the ``model`` section, batch sizes)
    decoding    a recipe's ``decoding`` section and ``decoding_grid``
    outputs     what generation returns (:class:`Generated`, the command line's JSON line)
    kinds       what kind of checkpoint a directory holds (:data:`KINDS`, :func:`checkpoint_kind`)
    session     inputs decoded by continuous batching (:class:`DecodingSession`)
"""

from __future__ import annotations

from scratchformer.tasks.shared.checks import check_batch, check_files, check_model_fields, check_range
from scratchformer.tasks.shared.decoding import (
    CAPTIONING_DECODING,
    DECODING_KEYS,
    TRANSLATION_DECODING,
    DecodingOptions,
    check_decoding,
    check_decoding_grid,
    choose_from_grid,
    decoding_combinations,
)
from scratchformer.tasks.shared.kinds import KINDS, UnknownKind, checkpoint_kind
from scratchformer.tasks.shared.outputs import Generated, generated_answer, rows_named
from scratchformer.tasks.shared.run import TrainingRun, stopped_early
from scratchformer.tasks.shared.sequences import label_smoothed_loss, pad_ids
from scratchformer.tasks.shared.session import DecodingSession

__all__ = [
    "CAPTIONING_DECODING",
    "DECODING_KEYS",
    "KINDS",
    "TRANSLATION_DECODING",
    "DecodingOptions",
    "DecodingSession",
    "Generated",
    "TrainingRun",
    "UnknownKind",
    "check_batch",
    "check_decoding",
    "check_decoding_grid",
    "check_files",
    "check_model_fields",
    "check_range",
    "checkpoint_kind",
    "choose_from_grid",
    "decoding_combinations",
    "generated_answer",
    "label_smoothed_loss",
    "pad_ids",
    "rows_named",
    "stopped_early",
]
