"""Text classification end to end: recipe -> tokenizer -> TextClassifier -> Trainer -> metrics.

recipe = ClassifierRecipe.from_json("recipes/imdb.json")
report = train_classifier(recipe)              # trains, keeps the best checkpoint, tests it
clf = load_classifier("runs/imdb/best")
clf.predict(["A wonderful film.", "Two hours I will never get back."])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.data.batching import length_bucketed_batches
from scratchformer.data.labelled_texts import DEFAULT_DATA_DIR, LabelledTexts, load_labelled_texts
from scratchformer.data.tokenization import (
    TRUNCATIONS,
    TextTokenizer,
    read_tokenizer,
    save_hf_tokenizer,
    train_wordpiece,
)
from scratchformer.fast import optimize
from scratchformer.formats.hf_bert import refuse_engine_export
from scratchformer.formats.hf_classifier import (
    classifier_from_pretrained,
    hf_classifier_export,
    is_classifier_export,
    load_classifier_export,
)
from scratchformer.formats.hf_files import write_export
from scratchformer.formats.onnx_export import export_classifier_onnx
from scratchformer.models.classifier import POOLINGS, ClassifierConfig, TextClassifier
from scratchformer.models.contextual import EncoderConfig
from scratchformer.tasks.shared import TrainingRun, check_batch, check_files, check_model_fields, check_range
from scratchformer.training import TrainConfig, distributed, resolve_device
from scratchformer.training.checkpoint import (
    foreign_checkpoint,
    load_checked,
    load_config,
    resolve_checkpoint,
)
from scratchformer.training.precision import at_least_fp32
from scratchformer.training.recipe import Recipe, resolve_data_path

__all__ = [
    "ClassificationTask",
    "ClassifierRecipe",
    "ClassifierRun",
    "LoadedClassifier",
    "classification_metrics",
    "load_classifier",
    "predict_proba",
    "train_classifier",
]


def classification_metrics(
    y_true: Sequence[int], y_pred: Sequence[int], label_names: Sequence[str]
) -> dict[str, Any]:
    """Accuracy, per-class precision/recall/F1, macro F1, and the confusion matrix [true][pred].
    Macro F1 averages the classes that occur in ``y_true`` or ``y_pred``, as scikit-learn's: a class
    never seen nor predicted (class 0 of labels 1..K) is not averaged in as an F1 of 0."""
    k = len(label_names)
    confusion = [[0] * k for _ in range(k)]
    for t, p in zip(y_true, y_pred):
        confusion[t][p] += 1
    per_class, occurring = {}, []  # occurring: the F1 of each class seen or predicted
    for c, name in enumerate(label_names):
        tp = confusion[c][c]
        predicted = sum(confusion[r][c] for r in range(k))
        actual = sum(confusion[c])
        precision = tp / predicted if predicted else 0.0
        recall = tp / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = {"precision": precision, "recall": recall, "f1": f1, "support": actual}
        occurring += [f1] if actual or predicted else []
    n = len(y_true)
    return {
        "accuracy": sum(confusion[c][c] for c in range(k)) / n if n else 0.0,
        "macro_f1": sum(occurring) / len(occurring) if occurring else 0.0,
        "per_class": per_class,
        "confusion": confusion,
        "n": n,
    }


@torch.no_grad()
def predict_proba(
    model: TextClassifier,
    tokenizer: TextTokenizer,
    ids: Sequence[Sequence[int]],
    batch_size: int = 64,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Class probabilities (N, C) for tokenized texts, batched by length, in the input order."""
    check_batch(batch_size)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    probs = torch.empty(len(ids), model.config.num_classes)
    for start in range(0, len(ids), batch_size):
        index = order[start : start + batch_size]
        batch = tokenizer.pad([ids[i] for i in index]).to(device)
        probs[index] = torch.softmax(at_least_fp32(model(batch.ids, batch.padding_mask)), dim=-1).cpu()
    return probs


class ClassificationTask:
    """The classification :class:`~scratchformer.training.TrainingTask`: cross-entropy on real labels."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        train: LabelledTexts,
        valid: LabelledTexts,
        model_config: ClassifierConfig,
        batch_size: int,
        eval_batch_size: int = 64,
    ):
        self.tokenizer = tokenizer
        self.label_names = train.label_names
        self.model_config = model_config
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.train_ids = tokenizer.encode(train.texts)
        self.train_labels = torch.tensor(train.labels)
        self.valid_ids = tokenizer.encode(valid.texts)
        self.valid_labels = torch.tensor(valid.labels)
        self.lengths = [len(x) for x in self.train_ids]

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        return length_bucketed_batches(self.lengths, self.batch_size, seed=seed, epoch=epoch)

    def loss(self, model: nn.Module, batch: list[int], device: torch.device) -> tuple[Tensor, int]:
        tokens = self.tokenizer.pad([self.train_ids[i] for i in batch]).to(device)
        logits = model(tokens.ids, tokens.padding_mask)  # (B, C)
        loss = F.cross_entropy(at_least_fp32(logits), self.train_labels[batch].to(device))
        return loss, int(tokens.padding_mask.sum())

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        probs = predict_proba(model, self.tokenizer, self.valid_ids, self.eval_batch_size, device)  # type: ignore[arg-type]
        loss = F.nll_loss(torch.log(probs.clamp_min(1e-12)), self.valid_labels).item()
        metrics = classification_metrics(
            self.valid_labels.tolist(), probs.argmax(-1).tolist(), self.label_names
        )
        return {"loss": loss, "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]}

    def checkpoint_config(self) -> dict[str, Any]:
        return {
            "kind": "text_classifier",
            "model": self.model_config.to_dict(),
            "labels": list(self.label_names),
            "tokenizer": self.tokenizer.settings(),
        }

    def save_files(self, directory: Path) -> None:
        self.tokenizer.save(directory / "tokenizer.json")


@dataclass
class ClassifierRecipe(Recipe):
    """Everything a classification run needs, loadable from JSON (see recipes/imdb.json).

    Paths may contain ``{data}``: the shared data directory (``--data-dir``, $SCRATCHFORMER_DATA,
    or ../shared/data).
    """

    train_file: str  # labelled training texts: .jsonl/.json/.csv, .gz ok
    test_file: str | None = None  # texts the chosen checkpoint is tested on at the end (None: no test)
    valid_file: str | None = None  # validation texts (None: ``valid_size`` held out of train_file)
    valid_size: int = 1000  # held out of the training file when there is no valid_file (then >= 1)
    text_field: str = "text"  # the key (JSONL) or column (CSV) of the text
    label_field: str = "label"  # the key (JSONL) or column (CSV) of the label
    label_names: list[str] | None = None  # the classes (>= 2 distinct names): integer labels index them,
    # string labels are among them (None: 0..max, or the sorted distinct strings, of the training file)
    vocab_size: int = 16000  # WordPiece vocabulary trained on the training texts (>= 8)
    lowercase: bool = True  # that WordPiece tokenizer lowercases and strips accents
    max_length: int = 512  # tokens per text, [CLS] and [SEP] included (>= 2); longer texts are cut
    truncation: str = "head_tail"  # "head" (keep the first max_length tokens) or "head_tail" (the first
    # head_length and the last max_length - head_length)
    head_length: int = 128  # tokens kept from the start by "head_tail", in (0, max_length)
    batch_size: int = 32  # texts per batch (>= 1)
    pooling: str = "mean"  # one vector per text: "mean" over the real tokens, "cls" (the first position) or
    # "pooler" (BERT's tanh(W h_[CLS] + b): BertForSequenceClassification's, the one pooling that exports to
    # Hugging Face; a pretrained encoder without pooler weights gets a new pooler, trained with the head)
    head_dropout: float = 0.1  # dropout on that vector, before the class head, in [0, 1)
    model: dict[str, Any] = field(default_factory=dict)  # EncoderConfig fields (vocab/pad come from the
    # tokenizer); with ``pretrained``, only dropout and attention_dropout (they replace the checkpoint's)
    pretrained: str | None = None  # a BERT checkpoint directory to start from (its tokenizer too)
    tokenizer: str | None = None  # a tokenizer.json to use instead of training one (identical vocabularies
    # across runs; not with pretrained)
    average_last: int = 0  # also try the average of the last N evaluated checkpoints (0: off)
    train: TrainConfig = field(default_factory=TrainConfig)  # how to train: TrainConfig's fields

    METRICS = ("loss", "accuracy", "macro_f1")

    def validate(self) -> None:
        check_range(
            self,
            {
                "valid_size": 0,
                "vocab_size": 8,
                "max_length": 2,
                "head_length": 0,
                "batch_size": 1,
                "average_last": 0,
            },
            ("head_dropout",),
        )
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f"truncation: expected one of {TRUNCATIONS}, got {self.truncation!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, got {self.pooling!r}")
        names = self.label_names
        if names is not None and (
            not isinstance(names, list)
            or not all(isinstance(n, str) for n in names)
            or len(set(names)) != len(names)
            or len(names) < 2
        ):
            raise ValueError(
                f"label_names: expected at least two distinct names (a list of strings), got {names!r}"
            )
        if self.valid_file is None and self.valid_size < 1:
            raise ValueError(
                f"valid_size must be >= 1 without a valid_file (it is held out of train_file), "
                f"got {self.valid_size}"
            )
        if self.truncation == "head_tail" and not 0 < self.head_length < self.max_length:
            raise ValueError(
                f"head_length must be in (0, max_length={self.max_length}) for truncation 'head_tail', "
                f"got {self.head_length}"
            )
        if self.pretrained and self.tokenizer:
            raise ValueError(
                "tokenizer: a pretrained encoder brings its own tokenizer.json; "
                "give pretrained or tokenizer, not both"
            )
        if self.pretrained:
            extra = sorted(set(self.model) - {"dropout", "attention_dropout"})
            if extra:
                raise ValueError(
                    f"model: {extra} cannot change a pretrained encoder (only dropout and attention_dropout)"
                )
        else:
            check_model_fields(
                EncoderConfig, self.model, self.max_length, vocab_size=self.vocab_size, pad_id=0
            )


class ClassifierRun(TrainingRun):
    """:func:`train_classifier`'s run (:class:`~scratchformer.tasks.shared.TrainingRun`): the labelled
    texts, a tokenizer and a TextClassifier (new, or on a pretrained encoder); then the chosen
    checkpoint (best, or the average of the last ``average_last``) on the test file."""

    def __init__(
        self, recipe: ClassifierRecipe, data_dir: str | Path = DEFAULT_DATA_DIR, resume: bool = False
    ):
        super().__init__(recipe, data_dir, resume)
        self.average_last = recipe.average_last

    def check(self) -> None:
        c = self.recipe
        if c.pretrained and not (Path(c.pretrained) / "config.json").is_file():
            raise FileNotFoundError(
                f"pretrained: no checkpoint directory at {c.pretrained} (config.json, model.safetensors, "
                "tokenizer.json); give --pretrained DIR"
            )

        def check_inputs() -> None:  # rank 0 reads them all
            check_files(
                self.data_dir, train_file=c.train_file, valid_file=c.valid_file, test_file=c.test_file
            )
            # a resumed run reads its own tokenizer
            check_files(self.data_dir, "tokenizer", tokenizer=None if self.resume else c.tokenizer)

        distributed.on_main(check_inputs)

    def load(self, path: str | None, label_names: list[str] | None) -> LabelledTexts:
        c = self.recipe
        return load_labelled_texts(
            resolve_data_path(path, self.data_dir),
            c.text_field,
            c.label_field,  # type: ignore[arg-type]
            label_names,
        )

    def setup(self) -> tuple[TextClassifier, ClassificationTask, dict[str, Any]]:
        c = self.recipe
        full = self.load(c.train_file, c.label_names)
        self.label_names = full.label_names
        train, valid = self.split(full)
        model, tokenizer = self.pretrained_classifier() if c.pretrained else self.new_classifier(train)
        task = ClassificationTask(tokenizer, train, valid, model.config, c.batch_size)
        return (
            model,
            task,
            {
                "parameters": model.num_parameters(),
                "train_examples": len(train),
                "valid_examples": len(valid),
                "skipped": full.skipped,
                "seconds_prepare": self.seconds(),
            },
        )

    def split(self, full: LabelledTexts) -> tuple[LabelledTexts, LabelledTexts]:
        """Training and validation texts: the valid_file's, or ``valid_size`` held out of the training
        file."""
        c = self.recipe
        if c.valid_file:
            return full, self.load(c.valid_file, full.label_names)
        if len(full) <= c.valid_size:
            raise ValueError(f"valid_size={c.valid_size} leaves no training text out of {len(full)}")
        perm = torch.randperm(len(full), generator=torch.Generator().manual_seed(c.train.seed)).tolist()
        return full.subset(perm[c.valid_size :]), full.subset(perm[: c.valid_size])

    def pretrained_classifier(self) -> tuple[TextClassifier, TextTokenizer]:
        """A class head on the pretrained encoder, with the encoder's tokenizer."""
        c = self.recipe
        model = classifier_from_pretrained(
            c.pretrained, len(self.label_names), c.pooling, c.head_dropout, **c.model
        )
        tokenizer = TextTokenizer.from_file(
            Path(c.pretrained) / "tokenizer.json",
            min(c.max_length, model.config.encoder.max_len),
            truncation=c.truncation,
            head_length=c.head_length,
        )
        optimize(model)
        return model, tokenizer

    def sized_model(self):
        c = self.recipe
        if c.pretrained:
            return None  # its size is the checkpoint's
        fields = {"max_len": c.max_length, **c.model, "vocab_size": c.vocab_size, "pad_id": 0}
        config = ClassifierConfig(
            EncoderConfig(**fields), len(c.label_names or "ab"), c.pooling, c.head_dropout
        )
        return lambda: TextClassifier(config)

    def new_classifier(self, train: LabelledTexts) -> tuple[TextClassifier, TextTokenizer]:
        """A new classifier, with WordPiece trained on the training texts (or the recipe's tokenizer file)."""
        c, resume = self.recipe, self.resume

        # WordPiece training is not deterministic across processes (docs/guides/training.md): every rank
        # takes rank 0's, and a resumed run the one its weights were trained with.
        def wordpiece() -> Tokenizer:  # on rank 0 (the checkpoints are its files), sent to the others
            if resume:
                saved = resolve_checkpoint(self.out / "last")
                labels = load_config(saved).get("labels")
                if labels != self.label_names:
                    raise ValueError(
                        f"--resume: {saved} was trained with labels {labels}, "
                        f"the data now gives {self.label_names}"
                    )
                return read_tokenizer(saved / "tokenizer.json")
            given = resolve_data_path(c.tokenizer, self.data_dir)
            return read_tokenizer(given) if given else train_wordpiece(train.texts, c.vocab_size, c.lowercase)

        tokenizer = TextTokenizer(
            distributed.on_main(wordpiece), c.max_length, truncation=c.truncation, head_length=c.head_length
        )
        encoder = EncoderConfig(
            **{
                "max_len": c.max_length,
                **c.model,
                "vocab_size": tokenizer.vocab_size,
                "pad_id": tokenizer.pad_id,
            }
        )
        config = ClassifierConfig(encoder, len(self.label_names), c.pooling, c.head_dropout)
        return self.new_model(lambda: TextClassifier(config)), tokenizer

    def finish(self, report: dict[str, Any]) -> None:
        c = self.recipe
        chosen = self.choose_checkpoint(report)
        if c.test_file:
            best = load_classifier(chosen, device=c.train.device)
            test = self.load(c.test_file, self.label_names)
            report["test"] = best.evaluate(test, precision=self.trainer.precision)
            report["test_skipped"] = test.skipped


def train_classifier(
    recipe: ClassifierRecipe, data_dir: str | Path = DEFAULT_DATA_DIR, resume: bool = False
) -> dict[str, Any]:
    """Run a recipe: tokenizer, model, training, then the best checkpoint on the test file.

    Returns (and writes to ``out_dir/report.json``) sizes, timings, validation and test metrics.
    Under torchrun every process runs this: rank 0 trains the tokenizer and sends it to the
    others, all train, then rank 0 alone averages, tests and writes the report (the other ranks
    return theirs without the test results).
    """
    return ClassifierRun(recipe, data_dir, resume).run()


class LoadedClassifier:
    """A trained classifier checkpoint, ready to predict and evaluate."""

    def __init__(
        self, model: TextClassifier, tokenizer: TextTokenizer, label_names: list[str], device: torch.device
    ):
        self.model, self.tokenizer, self.label_names, self.device = model, tokenizer, label_names, device

    def predict(
        self, texts: Sequence[str], batch_size: int = 64, precision: str = "fp32"
    ) -> list[tuple[str, float]]:
        """(label, probability) for each text."""
        probs = self.probabilities(texts, batch_size, precision)
        return [(self.label_names[int(i)], float(p)) for p, i in zip(*probs.max(dim=-1))]

    def probabilities(self, texts: Sequence[str], batch_size: int = 64, precision: str = "fp32") -> Tensor:
        dtype = torch.bfloat16 if precision == "bf16" else None
        with torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            return predict_proba(
                self.model, self.tokenizer, self.tokenizer.encode(texts), batch_size, self.device
            )

    def evaluate(self, data: LabelledTexts, batch_size: int = 64, precision: str = "fp32") -> dict[str, Any]:
        if list(data.label_names) != self.label_names:
            raise ValueError(
                f"the data's classes {data.label_names} differ from the model's {self.label_names}"
            )
        predicted = self.probabilities(data.texts, batch_size, precision).argmax(-1).tolist()
        return classification_metrics(data.labels, predicted, self.label_names)

    def save_pretrained(
        self, directory: str | Path, format: str = "hf", truncation: str | None = None
    ) -> Path:
        """Write a Hugging Face ``BertForSequenceClassification`` directory whose labels and probabilities
        ``AutoModelForSequenceClassification`` and ``pipeline("text-classification", truncation=True)``
        give, and :func:`load_classifier` reads (config.json's ``scratchformer_classifier`` keeps our
        tokenizer settings). Pooling "pooler" only (see ``hf_classifier_export``); ``format="onnx"``
        writes any pooling as ONNX. Truncation "head_tail"
        has no transformers setting (it cuts one end): refused, unless ``truncation="head"`` exports
        (and so reads back) the model cutting the head."""
        if format == "onnx":  # any pooling: model.onnx + tokenizer.json (see export_classifier_onnx)
            return export_classifier_onnx(self.model, self.tokenizer, directory, self.label_names)
        if format != "hf":
            raise ValueError(
                f"format: expected 'hf' (BertForSequenceClassification) or 'onnx', got {format!r}"
            )
        t = self.tokenizer
        if truncation is not None:  # (checked by TextTokenizer)
            t = TextTokenizer(t.tokenizer, t.max_length, t.pad_token, truncation, t.head_length)
        hf_config, state = hf_classifier_export(self.model, self.label_names, t.settings())
        tokenizer_files = lambda tmp: save_hf_tokenizer(t.tokenizer, tmp, max_length=t.max_length)  # noqa: E731
        return write_export(directory, hf_config, state, tokenizer_files)


def load_classifier(directory: str | Path, device: str = "auto") -> LoadedClassifier:
    """Load a checkpoint written by :func:`train_classifier` (weights via safetensors), its Hugging
    Face export (0.8.0's too), or any ``BertForSequenceClassification`` directory."""
    refuse_engine_export(directory)
    directory = resolve_checkpoint(directory)
    config = load_config(directory)
    export = is_classifier_export(config)
    if export:
        model, settings, labels = load_classifier_export(directory, config)
        model_config = model.config
    elif config.get("kind") != "text_classifier":
        raise ValueError(foreign_checkpoint(directory, config, "text_classifier"))
    else:
        model_config = ClassifierConfig.from_dict(config["model"])
        settings, labels = config["tokenizer"], list(config["labels"])
    try:
        tokenizer = TextTokenizer.from_file(
            directory / "tokenizer.json",
            settings["max_length"],
            settings["pad_token"],
            truncation=settings["truncation"],
            head_length=settings["head_length"],
        )
    except ValueError as e:
        raise ValueError(f"{directory / 'tokenizer.json'} does not belong to this model ({e})") from None
    encoder = model_config.encoder
    if tokenizer.vocab_size != encoder.vocab_size or tokenizer.pad_id != encoder.pad_id:
        raise ValueError(
            f"{directory / 'tokenizer.json'} does not belong to this model: {tokenizer.vocab_size} tokens, "
            f"pad id {tokenizer.pad_id}; the model has {encoder.vocab_size} tokens, pad id {encoder.pad_id}"
        )
    if len(labels) != model_config.num_classes or len(set(labels)) != len(labels):
        raise ValueError(
            f"{directory / 'config.json'}: labels {labels} do not match the model's "
            f"{model_config.num_classes} classes"
        )
    model = optimize(model if export else load_checked(directory, lambda: TextClassifier(model_config)))
    dev = resolve_device(device)
    return LoadedClassifier(model.to(dev).eval(), tokenizer, labels, dev)
