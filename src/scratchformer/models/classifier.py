"""Text classifier: our encoder, pooled to one vector, then a linear layer to class logits.

    logits = W · dropout(pool(Encoder(tokens))) + b        (B, C), C = number of classes

Pooling is the mean over real (non-padding) tokens, the [CLS] vector, or BERT's pooler on it,
tanh(W_p h_[CLS] + b_p): that last one is ``BertForSequenceClassification``'s, so such a classifier
is exported as one (:func:`hf_classifier_export`) and read back from one
(:func:`load_classifier_export`, any Hugging Face ``BertForSequenceClassification`` directory too).
The labels come from the data, never from the input tokens, and the head has ``num_classes``
outputs, not V.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from scratchformer.models.contextual import ContextualEncoder, EncoderConfig
from scratchformer.models.hf_files import (
    CLASSIFIER_EXPORT_HEAD,
    CLASSIFIER_EXPORT_KEY,
    CheckpointError,
    read_json,
    read_weights,
    require_file,
)
from scratchformer.models.pooling import POOLING_MODES, pool
from scratchformer.models.pretrained import bert_encoder_from, bert_export, bert_problems

__all__ = [
    "POOLINGS",
    "ClassifierConfig",
    "TextClassifier",
    "hf_classifier_export",
    "is_classifier_export",
    "load_classifier_export",
]

POOLINGS = (*POOLING_MODES, "pooler")  # "pooler": BERT's tanh(W_p h_[CLS] + b_p)
HF_CLASSIFIER = "BertForSequenceClassification"  # the Hugging Face class of pooling "pooler"


@dataclass
class ClassifierConfig:
    encoder: EncoderConfig  # the encoder's configuration
    num_classes: int = 2  # C, the number of classes (>= 2)
    pooling: str = "mean"  # "mean" over the real tokens, "cls" (the first position's vector) or "pooler"
    # (BERT's tanh(W h_[CLS] + b), BertForSequenceClassification's; it sets encoder.pooler)
    head_dropout: float = 0.1  # dropout on the pooled vector, before the class head

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):
            self.encoder = EncoderConfig.from_dict(self.encoder)
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, got {self.pooling!r}")
        if self.pooling == "pooler" and not self.encoder.pooler:  # the pooler is the encoder's (BERT's)
            self.encoder = replace(self.encoder, pooler=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "encoder": self.encoder.to_dict(),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "head_dropout": self.head_dropout,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassifierConfig:
        unknown = sorted(set(data) - {"encoder", "num_classes", "pooling", "head_dropout"})
        if unknown:
            raise ValueError(f"ClassifierConfig: unknown fields {unknown}")
        return cls(**data)


class TextClassifier(nn.Module):
    """tokens (B, L) -> class logits (B, C)."""

    def __init__(self, config: ClassifierConfig):
        super().__init__()
        self.config = config
        self.encoder = ContextualEncoder(config.encoder)
        self.dropout = nn.Dropout(config.head_dropout)
        self.head = nn.Linear(config.encoder.d_model, config.num_classes)

    @classmethod
    def from_pretrained_encoder(
        cls,
        directory: str | Path,
        num_classes: int,
        pooling: str = "mean",
        head_dropout: float = 0.1,
        dropout: float | None = None,
        attention_dropout: float | None = None,
    ) -> TextClassifier:
        """Start from a pretrained BERT-family checkpoint directory (see scratchformer.models.pretrained).
        ``dropout``, ``attention_dropout``: replace the checkpoint's (as ``hidden_dropout_prob`` and
        ``attention_probs_dropout_prob`` given to ``from_pretrained`` do); None keeps them. Pooling
        "pooler" uses the checkpoint's pooler; one without (DistilBERT, some sentence-transformers
        models) gets a new one, initialised as any new linear layer and trained with the head, as
        ``BertForSequenceClassification.from_pretrained`` does."""
        from scratchformer.models.pretrained import load_bert_encoder

        encoder = load_bert_encoder(directory)
        changes = {
            k: v for k, v in (("dropout", dropout), ("attention_dropout", attention_dropout)) if v is not None
        }
        model = cls(ClassifierConfig(replace(encoder.config, **changes), num_classes, pooling, head_dropout))
        state = encoder.state_dict()
        if model.encoder.pooler is not None and encoder.pooler is None:  # a new pooler: its own init
            state |= {f"pooler.{k}": v for k, v in model.encoder.pooler.state_dict().items()}
        model.encoder.load_state_dict(state)
        return model

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(
        self, tokens: Tensor, padding_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """tokens (B, L); padding_mask (B, L) bool, True at real tokens (default ``!= pad_id``) -> (B, C)."""
        if padding_mask is None:
            pad_id = self.config.encoder.pad_id
            padding_mask = (
                tokens != pad_id if pad_id is not None else tokens.new_ones(tokens.shape, dtype=torch.bool)
            )
        hidden = self.encoder(tokens, padding_mask, token_type_ids)  # (B, L, D)
        if self.config.pooling == "pooler":
            pooled = self.encoder.pool(hidden)  # tanh(W_p h_[CLS] + b_p), (B, D)
        else:
            pooled = pool(hidden, padding_mask, self.config.pooling)
        return self.head(self.dropout(pooled))


# ---- Hugging Face BertForSequenceClassification, out and in ----------------------------------------


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
