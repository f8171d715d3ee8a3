"""What kind of checkpoint a directory holds: the one answer the command line, the exports, the
server and its page use (:data:`KINDS`, :func:`checkpoint_kind`)."""

from __future__ import annotations

from pathlib import Path

from scratchformer.formats.hf_bert import refuse_engine_export
from scratchformer.formats.hf_classifier import is_classifier_export
from scratchformer.formats.marian import is_marian_dir
from scratchformer.training.checkpoint import foreign_checkpoint, load_config, resolve_checkpoint

__all__ = ["KINDS", "UnknownKind", "checkpoint_kind"]

KINDS = (
    "translation",  # ours (kind "translation") or a Hugging Face Marian/Pegasus directory
    "text_classifier",  # ours, our classifier export, or a BertForSequenceClassification
    "captioning",  # ours
    "masked_lm",  # ours (a masked-LM pretraining run's checkpoint)
    "embedding",  # a sentence-transformers directory or another Hugging Face (BERT-family) encoder
)


class UnknownKind(ValueError):
    """A checkpoint of ours whose config.json records a ``kind`` outside :data:`KINDS`."""

    def __init__(self, message: str, kind: object):
        super().__init__(message)
        self.kind = kind


def checkpoint_kind(checkpoint: str | Path) -> str:
    """One of :data:`KINDS` for a checkpoint directory (or a run folder: its ``best/``). Ours records
    its kind in config.json; a Hugging Face Marian directory is a translation model, our classifier
    export (and any ``BertForSequenceClassification``) a text classifier, a sentence-transformers
    directory (modules.json) or any other Hugging Face model an embedding model. An ONNX or
    CTranslate2 export is an error saying how to run it; a config.json with neither a kind nor a
    ``model_type`` an error naming what the commands take, a kind outside :data:`KINDS` an
    :class:`UnknownKind`."""
    refuse_engine_export(checkpoint)
    if is_marian_dir(checkpoint):
        return "translation"
    if (Path(checkpoint) / "modules.json").is_file():
        return "embedding"
    directory = resolve_checkpoint(checkpoint)
    config = load_config(directory)
    if is_classifier_export(config):
        return "text_classifier"
    kind = config.get("kind")
    if kind is None and isinstance(config.get("model_type"), str):
        return "embedding"
    if kind is None:
        raise ValueError(foreign_checkpoint(directory, config, "scratchformer"))
    if kind not in KINDS:
        raise UnknownKind(foreign_checkpoint(directory, config, "scratchformer"), kind)
    return kind
