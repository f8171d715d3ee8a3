"""What more than one task uses: the run every training task follows (:class:`TrainingRun`), the
label-smoothed loss of sequence training, id padding, the checks of recipe sections, and what
generation returns.
(A task never imports another task; what two share lives here or lower.)"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar, get_type_hints

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from scratchformer.fast import optimize
from scratchformer.training import Trainer, TrainingTask, TrainResult, check_run, distributed
from scratchformer.training.checkpoint import write_text_atomically
from scratchformer.training.precision import at_least_fp32
from scratchformer.training.recipe import resolve_data_path
from scratchformer.training.run_checks import (
    check_memory,
    count_parameters,
    release_run,
    resolve_device,
    training_bytes,
)

__all__ = [
    "Generated",
    "TrainingRun",
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

M = TypeVar("M", bound=nn.Module)


class TrainingRun:
    """One run of a training recipe: the skeleton that ``train_classifier``, ``train_translation``,
    ``train_captioner`` and ``pretrain_mlm`` share. :meth:`run` goes through it in order::

        check_run     the device, the precision, the output directory (before any data work)
        check()       hook: the task's inputs exist (its files, a pretrained checkpoint)
        setup()       hook: data, tokenizer, model (new_model: seeded), the TrainingTask;
                      the report's first entries
        train()       the Trainer fits the task: the report's seconds_train, best_valid
        -- rank 0 alone from here; the other ranks return their report --
        finish()      hook: test the chosen checkpoint (choose_checkpoint) or export it
        report.json   the report, with seconds_total, written to out_dir

    A task subclasses it with its hooks, and its ``train_*`` function is
    ``TaskRun(recipe, data_dir, resume).run()``. Under torchrun every process runs it.
    """

    average_last = 0  # the chosen checkpoint may be the average of the last N snapshots (0, 1: off)

    def __init__(self, recipe: Any, data_dir: str | Path, resume: bool = False) -> None:
        self.start = time.perf_counter()
        self.recipe, self.data_dir, self.resume = recipe, data_dir, resume
        self.config = recipe.train  # the recipe's TrainConfig
        self.out = Path(self.config.out_dir)

    def run(self) -> dict[str, Any]:
        """The run, start to end; returns the report (also written to ``out_dir/report.json``)."""
        distributed.init(self.config.device)
        existed = self.out.exists()
        check_run(
            self.config, self.resume
        )  # device, precision, output directory (locked): before any data work
        try:
            self.check()
            self.check_memory()
            if distributed.is_main():  # the resolved recipe, defaults included: --config reruns it
                write_text_atomically(
                    self.out / "recipe.json", json.dumps(self.recipe.to_dict(), indent=2) + "\n"
                )
            model, task, report = self.setup()
            report.update(self.train(model, task))
            if not distributed.is_main():
                return report
            self.finish(report)
            report["seconds_total"] = self.seconds()
            (self.out / "report.json").write_text(json.dumps(report, indent=2))
            return report
        finally:
            release_run(self.out)
            if not existed and self.out.is_dir() and not any(self.out.iterdir()):
                self.out.rmdir()  # a run refused before its first output leaves no folder behind

    def sized_model(self) -> Callable[[], nn.Module] | None:
        """Hook: a builder of the recipe's model at its real size (vocabulary from the recipe), for
        the memory check before any data work; None: the size is known only from the data."""
        return None

    def check_memory(self) -> None:
        """Refuse a model that cannot be trained in this device's memory (parameters, gradients and
        AdamW's two moments; counted on the meta device), before any data or tokenizer work."""
        build = self.sized_model()
        if build is not None:
            n = count_parameters(build)
            what = f"a model of {n:,} parameters trained with AdamW"
            check_memory(training_bytes(n), what, resolve_device(self.config.device))

    def check(self) -> None:
        """Hook: check the task's inputs before any data work (none by default)."""

    def setup(self) -> tuple[nn.Module, TrainingTask, dict[str, Any]]:
        """Hook: the model, the training task, and the report's first entries (sizes, timings)."""
        raise NotImplementedError

    def finish(self, report: dict[str, Any]) -> None:
        """Hook, on rank 0 after training: test the chosen checkpoint (or export it) into ``report``."""

    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def new_model(self, build: Callable[[], M]) -> M:
        """``build()`` the model from the recipe's seed (every rank starts from the same weights), its
        modules switched to their fast versions (:func:`~scratchformer.fast.optimize`)."""
        torch.manual_seed(self.config.seed)
        model = build()
        optimize(model)
        return model

    def train(self, model: nn.Module, task: TrainingTask) -> dict[str, Any]:
        """Fit ``task`` (keeping ``average_last`` snapshots to average); the report's training entries."""
        self.config.keep_checkpoints = max(self.config.keep_checkpoints, self.average_last)
        self.trainer = Trainer(model, task, self.config)
        self.result = self.trainer.fit(resume=self.resume)
        return {
            "precision": self.trainer.precision,  # what the run computed in ("auto" resolved)
            "seconds_train": self.result.seconds,
            "best_valid": self.result.best,
            **stopped_early(self.result),
        }

    def choose_checkpoint(self, report: dict[str, Any]) -> Path:
        """The checkpoint to test: ``best``, or ``averaged`` (the mean of the last ``average_last``
        snapshots) where that is at least as good on validation; recorded in ``report``."""
        chosen = "best"
        if self.average_last > 1:
            chosen, report["averaged_valid"] = self.trainer.average_last(self.average_last, self.result.best)
        report["test_checkpoint"] = chosen
        return self.out / chosen


def stopped_early(result: TrainResult) -> dict[str, Any]:
    """``{"stopped_early": ...}`` for the report where the Trainer stopped the run early, else ``{}``."""
    value = getattr(result, "stopped_early", None)
    return {"stopped_early": value} if value else {}


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int) -> Tensor:
    """Cross-entropy with label smoothing (paper, 5.4: eps_ls = 0.1), averaged over non-pad tokens.

    logits (B, T, V), target (B, T): the target distribution puts 1 - eps on the gold token and
    eps spread uniformly over the vocabulary (PyTorch's ``label_smoothing``); padding positions
    contribute nothing.
    """
    return F.cross_entropy(
        at_least_fp32(logits).flatten(0, 1), target.flatten(), ignore_index=pad_id, label_smoothing=smoothing
    )


def pad_ids(
    sequences: Sequence[Sequence[int]], device: torch.device | str = "cpu", pad_id: int = 0
) -> Tensor:
    """Token id lists of different lengths -> (B, L_max) long tensor, right-padded with ``pad_id``."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


class DecodingOptions(TypedDict, total=False):
    """The keys of a recipe's ``decoding`` section (and of a translation recipe's ``decoding_grid``),
    checked by :func:`check_decoding`; a key left out keeps the task's default."""

    beam_size: int  # hypotheses kept at each step, >= 1 (1: greedy search)
    length_penalty: float  # a hypothesis's score is log_prob / length ** length_penalty (finite)
    max_len_a: float  # at most max_len_a * S + max_len_b new tokens for a source of S tokens (>= 0),
    # within the model's max_len
    max_len_b: int  # the constant term of that limit (>= 0)
    no_repeat_ngram_size: int  # captioning: no n-gram of this size twice in a caption (0: off)
    min_new_tokens: int  # captioning: no end of the caption before this many words (0: off)


DECODING_KEYS: dict[str, type] = get_type_hints(DecodingOptions)  # key -> int or float
TRANSLATION_DECODING = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
CAPTIONING_DECODING = ("beam_size", "length_penalty", "no_repeat_ngram_size", "min_new_tokens")


def check_decoding(decoding: dict[str, Any], allowed: tuple[str, ...] = TRANSLATION_DECODING) -> None:
    """A recipe's ``decoding`` section: known keys only, beam_size >= 1, finite numbers >= 0."""
    unknown = sorted(set(decoding) - set(allowed))
    if unknown:
        raise ValueError(f"decoding: unknown keys {unknown} (expected some of {list(allowed)})")
    for key, value in decoding.items():
        integer = DECODING_KEYS[key] is int
        if (
            isinstance(value, bool)
            or not isinstance(value, int if integer else (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(
                f"decoding.{key}: expected a finite {'integer' if integer else 'number'}, got {value!r}"
            )
        low = {"beam_size": 1, "max_len_a": 0, "max_len_b": 0, "no_repeat_ngram_size": 0, "min_new_tokens": 0}
        if key in low and value < low[key]:
            raise ValueError(f"decoding.{key} must be >= {low[key]}, got {value!r}")


def decoding_combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a ``decoding_grid``'s values:
    {"a": [1, 2], "b": [3]} -> [{"a": 1, "b": 3}, {"a": 2, "b": 3}]."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def choose_from_grid(
    decoding: dict[str, Any],
    grid: dict[str, list[Any]],
    score: Callable[[dict[str, Any]], dict[str, Any]],
    metric: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every combination of ``grid`` on top of ``decoding``, scored by ``score(full decoding)``;
    returns the decoding whose ``metric`` is highest (the first of equals) and each combination's
    options with its scores (a task's ``choose_decoding``)."""
    combinations = decoding_combinations(grid)
    trials = [{**options, **score({**decoding, **options})} for options in combinations]
    best = max(range(len(trials)), key=lambda i: (trials[i][metric], -i))
    return {**decoding, **combinations[best]}, trials


def check_decoding_grid(
    decoding: dict[str, Any], grid: Any, allowed: tuple[str, ...] = TRANSLATION_DECODING
) -> None:
    """A recipe's ``decoding_grid``: an object of non-empty lists, each combination on top of
    ``decoding`` a valid decoding section."""
    if not isinstance(grid, dict):
        raise ValueError(f"decoding_grid: expected an object of lists, got {grid!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"decoding_grid.{key}: expected a non-empty list of values, got {values!r}")
    for options in decoding_combinations(grid):
        check_decoding({**decoding, **options}, allowed)


def _check_integer(name: str, value: Any, low: int) -> None:
    """``value`` is None or an integer (not a bool) >= ``low``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_batch(batch_size: int, beam_size: int | None = None) -> None:
    """Decoding/inference arguments: batch_size >= 1 and beam_size >= 1 (if given)."""
    _check_integer("batch_size", batch_size, 1)
    _check_integer("beam_size", beam_size, 1)


def check_range(recipe: object, at_least: dict[str, int], fractions: tuple[str, ...] = ()) -> None:
    """Integer fields of ``recipe`` must be >= their bound; ``fractions`` must be in [0, 1)."""
    for name, low in at_least.items():
        _check_integer(name, getattr(recipe, name), low)
    for name in fractions:
        value = getattr(recipe, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def check_files(data_dir: str | Path, kind: str = "data", **paths: str | None) -> None:
    """The ``kind`` files that recipe fields name (field=path; None: not used; ``{data}`` is
    ``data_dir``) exist: a run checks every input before any work starts, not after training."""
    for name, path in paths.items():
        resolved = resolve_data_path(path, data_dir)
        if resolved is not None and not Path(resolved).is_file():
            raise FileNotFoundError(f"{name}: {kind} file not found: {resolved}")


def check_model_fields(
    config_cls: type, fields: dict[str, Any], max_length: int | None = None, **filled: Any
) -> None:
    """The recipe's ``model`` section builds a valid ``config_cls`` (with ``filled`` standing in for
    what the data decides later, e.g. the vocabulary size): known keys only (an unknown one names the
    closest, as the recipe's own fields do). ``max_length``: the recipe's tokens per text, the
    section's ``max_len`` when it has none; a ``max_len`` shorter is refused here, not at the first
    long text once training has started."""
    known = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        close = [c for name in unknown for c in difflib.get_close_matches(name, known, n=3)]
        hint = f"; did you mean {' or '.join(dict.fromkeys(close))}?" if close else ""
        raise ValueError(f"unknown fields under 'model': {unknown}{hint}")
    if max_length is not None:
        fields = {"max_len": max_length, **fields}
        if isinstance(fields["max_len"], int) and fields["max_len"] < max_length:
            raise ValueError(f"model.max_len={fields['max_len']} is shorter than max_length={max_length}")
    try:
        config_cls(**{**fields, **filled})
    except TypeError as e:
        raise ValueError(f"model: {e}".replace(f"{config_cls.__name__}.__init__() ", "")) from None
    except ValueError as e:
        raise ValueError(f"model: {e}") from None


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


def checkpoint_kind(checkpoint: str | Path) -> str:
    """The "kind" a checkpoint's config.json records ("translation", "text_classifier",
    "captioning", ...); a Hugging Face Marian directory is a translation model, our classifier export
    (and any ``BertForSequenceClassification``) a text classifier. An ONNX or CTranslate2 export is an
    error saying how to run it; any other directory one naming what it holds (a Hugging Face export,
    or a config.json with no kind) and what the commands take."""
    from scratchformer.formats.hf_bert import refuse_engine_export
    from scratchformer.formats.hf_classifier import is_classifier_export
    from scratchformer.formats.marian import is_marian_dir
    from scratchformer.training.checkpoint import foreign_checkpoint, load_config, resolve_checkpoint

    refuse_engine_export(checkpoint)
    if is_marian_dir(checkpoint):
        return "translation"
    directory = resolve_checkpoint(checkpoint)
    config = load_config(directory)
    if is_classifier_export(config):
        return "text_classifier"
    kind = config.get("kind")
    if not isinstance(kind, str):
        raise ValueError(foreign_checkpoint(directory, config, "scratchformer"))
    return kind
