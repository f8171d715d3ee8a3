"""The run every training task follows (:class:`TrainingRun`): the run's checks, the task's hooks,
training, the test of the chosen checkpoint and the report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from scratchformer.fast import optimize
from scratchformer.training import Trainer, TrainingTask, TrainResult, check_run, distributed
from scratchformer.training.checkpoint import write_text_atomically
from scratchformer.training.run_checks import (
    check_memory,
    count_parameters,
    release_run,
    resolve_device,
    training_bytes,
)

__all__ = ["TrainingRun", "stopped_early"]

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
