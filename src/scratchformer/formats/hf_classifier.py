"""Our :class:`~scratchformer.models.classifier.TextClassifier` in and out of Hugging Face's
``BertForSequenceClassification``, and a classifier started from a pretrained BERT-family encoder.

Pooling "pooler", tanh(W_p h_[CLS] + b_p), is that class's: such a classifier is exported as one
(:func:`hf_classifier_export`) and read back from one (:func:`load_classifier_export`, any Hugging
Face ``BertForSequenceClassification`` directory too)::

    encoder, its pooler included    -> bert.* (as hf_bert.bert_export writes a BertModel)
    head                            -> classifier.weight (C, D), classifier.bias (C,)
    labels                          -> id2label, label2id
    labels, pooling, head dropout,  -> scratchformer_classifier (what BERT's config cannot say)
    tokenizer settings
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from scratchformer.formats.hf_bert import bert_encoder_from, bert_export, bert_problems, load_bert_encoder
from scratchformer.formats.hf_files import (
    CLASSIFIER_EXPORT_HEAD,
    CLASSIFIER_EXPORT_KEY,
    CheckpointError,
    read_json,
    read_weights,
    require_file,
)
from scratchformer.models.classifier import ClassifierConfig, TextClassifier

__all__ = [
    "HF_CLASSIFIER",
    "classifier_from_pretrained",
    "hf_classifier_export",
    "is_classifier_export",
    "load_classifier_export",
]

HF_CLASSIFIER = "BertForSequenceClassification"  # the Hugging Face class of pooling "pooler"


def classifier_from_pretrained(
    directory: str | Path,
    num_classes: int,
    pooling: str = "mean",
    head_dropout: float = 0.1,
    dropout: float | None = None,
    attention_dropout: float | None = None,
) -> TextClassifier:
    """A new class head on the encoder of a pretrained BERT-family checkpoint directory (read by
    :func:`~scratchformer.formats.hf_bert.load_bert_encoder`); the arguments as
    :meth:`TextClassifier.from_encoder <scratchformer.models.classifier.TextClassifier.from_encoder>`'s."""
    return TextClassifier.from_encoder(
        load_bert_encoder(directory), num_classes, pooling, head_dropout, dropout, attention_dropout
    )


def hf_classifier_export(
    model: TextClassifier, labels: list[str], tokenizer: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config.json, tensors) of a ``transformers.BertForSequenceClassification`` computing our
    logits: the encoder (its pooler included) under ``bert.``, the head as ``classifier.``; id2label
    and label2id hold ``labels``, and ``scratchformer_classifier`` what BERT's config cannot: the
    labels again, the pooling, the head's dropout, ``tokenizer`` (``TextTokenizer.settings()``). Only
    pooling "pooler" is that class; any other, an encoder BERT cannot express, or a truncation
    transformers' tokenizers cannot ("head_tail": they cut one end) is a ValueError naming every
    problem and the way out (ONNX)."""
    c = model.config
    problems = []
    if c.pooling != "pooler":
        problems.append(
            f"a classifier with {c.pooling} pooling has no Hugging Face sequence-classification class "
            f"({HF_CLASSIFIER} classifies tanh(pooler([CLS])), pooling 'pooler')"
        )
    encoder = bert_problems(c.encoder)
    if encoder:
        problems.append("its encoder cannot be written as BERT: " + "; ".join(encoder))
    if tokenizer and tokenizer.get("truncation", "head") != "head":
        length, head = tokenizer["max_length"], tokenizer["head_length"]
        problems.append(
            f"truncation {tokenizer['truncation']!r} (a long text's first {head} and last {length - head} "
            "tokens) has no transformers tokenizer setting, which cuts one end (export truncation 'head')"
        )
    if problems:
        raise ValueError("; ".join(problems) + "; export it with --format onnx")
    if len(labels) != c.num_classes or len(set(labels)) != len(labels):
        raise ValueError(f"labels: expected {c.num_classes} distinct names, got {labels}")
    hf_config, encoder_state = bert_export(model.encoder)
    state = {f"bert.{k}": v for k, v in encoder_state.items()}
    state |= {f"classifier.{k}": v.detach().float().cpu() for k, v in model.head.state_dict().items()}
    return hf_config | {
        "architectures": [HF_CLASSIFIER],
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
        "problem_type": "single_label_classification",
        "classifier_dropout": c.head_dropout,
        CLASSIFIER_EXPORT_KEY: {
            "labels": list(labels),
            "pooling": "pooler",
            "head_dropout": c.head_dropout,
            "tokenizer": tokenizer,
        },
    }, state


def is_classifier_export(config: dict[str, Any]) -> bool:
    """Whether a config.json is a classifier :func:`load_classifier_export` reads: ours (``scratchformer_
    classifier``) or a Hugging Face ``BertForSequenceClassification``. Another sequence-classification
    class (RoBERTa's, DistilBERT's: a head of their own) is a CheckpointError naming it."""
    architectures = config.get("architectures") or []
    if CLASSIFIER_EXPORT_KEY in config or HF_CLASSIFIER in architectures:
        return True
    other = [a for a in architectures if isinstance(a, str) and a.endswith("ForSequenceClassification")]
    if other:
        raise CheckpointError(
            f"config.json: architectures {other}: only {HF_CLASSIFIER}'s head (a linear layer on "
            "tanh(pooler([CLS]))) is read, not the head of another class"
        )
    return False


def load_classifier_export(
    directory: Path, config: dict[str, Any]
) -> tuple[TextClassifier, dict[str, Any], list[str]]:
    """(model, tokenizer settings, labels) of a Hugging Face classifier directory (``config``: its
    config.json): a ``BertForSequenceClassification`` (ours, from ``LoadedClassifier.save_pretrained``,
    or anyone's: labels from id2label, the tokenizer cutting the head at tokenizer_config.json's
    ``model_max_length``), or the BERT encoder + ``classifier_head.safetensors`` that 0.8.0 wrote."""
    about = config.get(CLASSIFIER_EXPORT_KEY)
    if about is not None and (not isinstance(about, dict) or not {"labels", "tokenizer"} <= set(about)):
        raise CheckpointError(
            f"{directory / 'config.json'}: {CLASSIFIER_EXPORT_KEY} must be an object with labels and "
            f"tokenizer (as scratchformer export writes it), got {about!r}"
        )
    hf_config, hf_state = read_weights(directory)
    source = directory / "model.safetensors"
    encoder = bert_encoder_from(hf_config, hf_state, source)
    if HF_CLASSIFIER in (config.get("architectures") or []):
        _check_problem_type(directory, config)
        head = {k.removeprefix("classifier."): v for k, v in hf_state.items() if k.startswith("classifier.")}
        if encoder.pooler is None or not head:
            missing = (["the pooler (bert.pooler.dense)"] if encoder.pooler is None else []) + (
                [] if head else ["the class head (classifier.weight, classifier.bias)"]
            )
            raise CheckpointError(f"{source} lacks {' and '.join(missing)} of a {HF_CLASSIFIER}")
        rows = next(iter(head.values())).shape[0]  # C
        labels = list(about["labels"]) if about else _hf_labels(directory, config, rows)
        settings = (about or {}).get("tokenizer") or _hf_tokenizer_settings(directory, encoder.config.max_len)
        pooling, head_dropout = "pooler", config.get("classifier_dropout")
        if head_dropout is None:  # transformers' rule: then the encoder's dropout
            head_dropout = config.get("hidden_dropout_prob", 0.1)
    else:  # 0.8.0: BertModel + classifier_head.safetensors
        if about is None:
            raise CheckpointError(f"{directory / 'config.json'}: not a classifier export")
        head_file = require_file(directory / CLASSIFIER_EXPORT_HEAD, "the class head of a classifier export")
        head, source = load_file(str(head_file)), head_file
        labels, settings = list(about["labels"]), about["tokenizer"]
        pooling, head_dropout = config.get("scratchformer_pooling", "mean"), about.get("head_dropout", 0.0)
    model = TextClassifier(ClassifierConfig(encoder.config, len(labels), pooling, head_dropout))
    model.encoder.load_state_dict(encoder.state_dict())
    try:
        model.head.load_state_dict(head)
    except RuntimeError as e:
        problems = "; ".join(line.strip() for line in str(e).splitlines()[1:] if line.strip())
        raise CheckpointError(
            f"{source}: the class head does not fit {len(labels)} labels: {problems}"
        ) from None
    return model.eval(), settings, labels


def _check_problem_type(directory: Path, config: dict[str, Any]) -> None:
    """Ours picks one label of several (a softmax); a multi-label (a sigmoid each) or regression
    model is not that: a CheckpointError."""
    problem = config.get("problem_type")
    if problem not in (None, "single_label_classification"):
        raise CheckpointError(
            f"{directory / 'config.json'}: problem_type {problem!r} is not supported: a scratchformer "
            "classifier picks one label of several (single_label_classification, a softmax)"
        )


def _hf_labels(directory: Path, config: dict[str, Any], rows: int) -> list[str]:
    """The labels of id2label (keys 0..C-1), as transformers reads them; none: LABEL_0 ... for each row."""
    id2label = config.get("id2label")
    if not id2label:
        return [f"LABEL_{i}" for i in range(rows)]
    try:
        labels = [str(id2label[str(i)]) for i in range(len(id2label))]
    except (KeyError, TypeError):
        raise CheckpointError(
            f"{directory / 'config.json'}: id2label must map 0..{len(id2label) - 1} to names, got {id2label}"
        ) from None
    if len(set(labels)) != len(labels):
        raise CheckpointError(f"{directory / 'config.json'}: id2label names a label twice: {labels}")
    return labels


def _hf_tokenizer_settings(directory: Path, max_len: int) -> dict[str, Any]:
    """How transformers' pipeline with ``truncation=True`` tokenises: the first ``model_max_length``
    tokens (tokenizer_config.json; at most the model's positions), its ``pad_token``."""
    path = directory / "tokenizer_config.json"
    found = read_json(path) if path.is_file() else {}
    limit, pad = found.get("model_max_length"), found.get("pad_token")
    return {
        "max_length": limit if isinstance(limit, int) and 1 <= limit <= max_len else max_len,
        "pad_token": pad if isinstance(pad, str) else None,
        "truncation": "head",
        "head_length": None,
    }
