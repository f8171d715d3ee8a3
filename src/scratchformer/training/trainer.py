"""The training loop shared by every task (classification, translation, captioning).

A task supplies the data and the loss (:class:`TrainingTask`); the :class:`Trainer` supplies
AdamW, warm-up + decay, gradient clipping and accumulation, mixed precision, periodic evaluation,
early stopping, the best and the last checkpoint, a JSONL log (and TensorBoard's), a loss-curve
PNG, and exact resumption.

The loop (:meth:`Trainer._fit`) is a few named steps, each a method::

    run = _start(resume)                         seeds, checks, optimizer, schedule; resumed state
    while steps are left and patience is not out:
        loss = _optimisation_step(run, _next_group(run))     accumulate, clip, step (None: fp16 skipped it)
        _log(run, loss)                          every log_every steps: metrics.jsonl, TensorBoard
                                                 (with the task's ``train_metrics()``, if it has one)
        _evaluate_and_save(run)                  every eval_every steps: best/, step-*/, patience
        save("last", ...)                        every save_every steps: the resumable checkpoint
    _finish(run)                                 the TrainResult

Under ``torchrun`` the same loop runs in every process (data parallelism, see
:mod:`scratchformer.training.distributed`): the model is wrapped in ``DistributedDataParallel``,
each rank trains on its share of every epoch's micro-batches, gradients are averaged across ranks
(only on the last micro-batch of an accumulation group: ``no_sync`` before it), the logged loss
and throughput are combined over all ranks, rank 0 evaluates and tells the others the result, and
rank 0 alone writes the log, the curves and the checkpoints.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from scratchformer.files import locks
from scratchformer.training import distributed
from scratchformer.training.checkpoint import (
    average_checkpoints,
    finish_interrupted_save,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from scratchformer.training.config import TrainConfig
from scratchformer.training.metrics import RunLog, plot_curves
from scratchformer.training.optimizer import adamw, optimizer_step
from scratchformer.training.precision import announce, resolve_precision
from scratchformer.training.run_checks import (
    LOCK,
    check_run,
    check_same_run,
    release_run,
    remove_earlier_run,
    resolve_device,
)
from scratchformer.training.schedule import lr_multiplier
from scratchformer.training.state import Run, restore, training_state

__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingTask", "resolve_device"]

MAX_CONSECUTIVE_SKIPS = 20  # fp16 overflows in a row before training stops


class TrainingTask(Protocol):
    """What the trainer needs from a task."""

    def batches(self, epoch: int, seed: int) -> list[Any]:
        """The micro-batches of one epoch, in order; the same for the same (epoch, seed)."""
        ...

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        """Mean loss of one micro-batch, and how many items (tokens) it covered.

        Under torchrun ``model`` is the ``DistributedDataParallel`` wrapper: call it (its
        ``forward``), which is what synchronises gradients; its other methods are on ``model.module``.
        """
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation metrics (model already in eval mode, no grad; the plain model, run by rank 0 only)."""
        ...

    def checkpoint_config(self) -> dict[str, Any]:
        """The JSON-able description saved as the checkpoint's config.json."""
        ...

    def save_files(self, directory: Path) -> None:
        """Write extra checkpoint files (the tokenizer) into ``directory``."""
        ...


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns (every rank the same)."""

    step: int  # optimizer steps done in all (a resumed run's included)
    losses: list[float]  # one per optimizer step run by this call
    evals: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] | None = None
    seconds: float = 0.0
    skipped_steps: int = 0  # fp16: optimizer steps the GradScaler skipped (overflow); not counted in step
    # patience ran out: {"step": where training stopped, "best_step": the best evaluation's, "patience": N}
    stopped_early: dict[str, int] | None = None


class Trainer:
    """Train ``model`` on ``task`` as ``config`` says.

    Example:
        >>> result = Trainer(model, task, TrainConfig(out_dir="runs/imdb", epochs=3)).fit()
        >>> Trainer(model, task, config).fit(resume=True)   # continue from runs/imdb/last
    """

    def __init__(self, model: nn.Module, task: TrainingTask, config: TrainConfig):
        self.model = model
        self.task = task
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.world = distributed.init(config.device)  # one process without torchrun: nothing started
        self.device = resolve_device(config.device)
        self.precision = resolve_precision(config.precision, self.device)  # "auto": bf16 where native
        if self.precision == "fp16" and self.device.type != "cuda":
            raise ValueError("precision 'fp16' needs a CUDA device (GradScaler); use 'bf16' on CPU")
        self.log = RunLog(self.out_dir, tensorboard=config.tensorboard)  # (rank 0 writes it)

    def _autocast(self) -> torch.autocast:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def evaluate(self) -> dict[str, float]:
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), self._autocast():
            metrics = self.task.evaluate(self.model, self.device)
        self.model.train(was_training)
        return metrics

    def save(self, name: str, training_state: dict[str, Any] | None = None) -> None:
        """Write the model as checkpoint ``out_dir/name`` (atomically), with the task's files.
        Under torchrun only rank 0 writes (every rank holds the same weights)."""
        if not self.world.is_main:
            return
        training = dict(asdict(self.config), precision=self.precision)  # what it ran in ("auto" resolved)
        config = dict(self.task.checkpoint_config(), training=training)
        save_checkpoint(self.out_dir / name, self.model, config, training_state, self.task.save_files)

    def average_last(self, n: int, best: dict[str, float] | None) -> tuple[str, dict[str, float]]:
        """Load the mean of the last ``n`` kept snapshots into the model and evaluate it; save it
        as ``averaged/`` if it is at least as good as ``best`` on ``best_metric``.

        Returns the name of the checkpoint to use ("averaged" or "best") and the averaged metrics,
        with "checkpoints": how many were averaged (fewer than ``n`` if the run evaluated fewer
        times, which is also a warning).
        """
        snapshots = sorted(self.out_dir.glob("step-*"))[-n:]
        if not snapshots:
            raise ValueError(f"no step-* snapshots in {self.out_dir} to average (set keep_checkpoints)")
        if len(snapshots) < n:
            warnings.warn(
                f"average_last={n}: the run kept only {len(snapshots)} evaluated checkpoint(s), one per "
                f"evaluation (eval_every={self.config.eval_every}); averaging {len(snapshots)}",
                stacklevel=2,
            )
        average_checkpoints(snapshots, self.model)
        metrics = {"checkpoints": len(snapshots), **self.evaluate()}
        key = self.config.best_metric
        at_least_as_good = best is None or (
            metrics[key] >= best[key] if self.config.best_mode == "max" else metrics[key] <= best[key]
        )
        if at_least_as_good:
            self.save("averaged")
        return ("averaged" if at_least_as_good else "best"), metrics

    def _better(self, value: float, than: float) -> bool:
        """Whether ``value`` of ``best_metric`` beats ``than`` (strictly)."""
        return value > than if self.config.best_mode == "max" else value < than

    # ---- the run: fit and its steps -----------------------------------------------------------

    def fit(self, resume: bool = False, on_step: Any = None) -> TrainResult:
        """Train (see :meth:`_fit`); with ``deterministic`` under deterministic algorithms, the
        process's previous setting restored afterwards."""
        previous = torch.are_deterministic_algorithms_enabled()
        if self.config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
            torch.use_deterministic_algorithms(True)
        took_lock = not locks.holds(Path(self.config.out_dir) / LOCK)  # (else the task took it and frees it)
        try:
            return self._fit(resume, on_step)
        finally:
            if took_lock:
                release_run(self.config.out_dir)
            self.log.close()
            if self.config.deterministic:
                torch.use_deterministic_algorithms(previous)

    def _fit(self, resume: bool = False, on_step: Any = None) -> TrainResult:
        """Train to ``max_steps`` (or ``epochs``), or until ``patience`` runs out. ``resume``
        continues from ``out_dir/last``.

        ``on_step(step, loss)`` is called after every optimizer step (e.g. to stop early); under
        torchrun ``loss`` (as ``TrainResult.losses``) is the mean over all ranks, the same everywhere.

        Under torchrun, every rank starts from rank 0's weights and draws its own random numbers
        (dropout) from ``seed + rank``; rank 0's stream is the one a single process would draw.
        """
        c = self.config
        run = self._start(resume)
        while run.step < run.total and run.stopped_early is None:
            loss = self._optimisation_step(run, self._next_group(run))
            if loss is None:
                # fp16: the scaler skipped this step: the schedule, the step count and the log do not move
                continue
            if run.due(c.log_every):
                self._log(run, loss)
            if run.due(c.eval_every):
                self._evaluate_and_save(run)
            if run.due(c.save_every) or run.stopped_early is not None:
                self.save("last", training_state(run, self.world, self.device))
            if on_step is not None:
                on_step(run.step, loss)
        return self._finish(run)

    def _start(self, resume: bool) -> Run:
        """Everything before the first step: the seeds, the model on its device, the checks, the
        output directory (an earlier run's outputs removed under ``overwrite``), the optimizer,
        schedule and scaler, with ``resume`` the weights and state of ``last/``; the log, the bar."""
        c = self.config
        if c.threads:
            torch.set_num_threads(c.threads)
        torch.manual_seed(c.seed + self.world.rank)
        random.seed(c.seed + self.world.rank)
        self.model.to(self.device)
        if self.precision == "fp64":
            self.model.double()
        self.model.train()
        check_run(c, resume)  # (the tasks ran it already, before their data work)
        # replace the earlier run now that this one starts
        if not resume and c.overwrite and self.world.is_main:
            remove_earlier_run(self.out_dir)
        state = self._resume_state() if resume else None  # (the weights load before DDP copies them)
        run = self._new_run()
        if state is not None:
            self._resume(run, state)
        if self.world.is_main:  # a resumed run's log is cut back to its step; a fresh run's starts empty
            self.log.start(run.step)
            announce(c, self.precision, self.device, f"steps {run.step}..{run.total}")
        run.start = run.window_start = time.perf_counter()
        run.bar = tqdm(
            total=run.total,
            initial=run.step,
            desc="training",
            unit="step",
            disable=not (c.progress and self.world.is_main),
            mininterval=1.0,
        )
        return run

    def _new_run(self) -> Run:
        """The optimisation of a fresh run: the model the steps call (DDP under torchrun), AdamW,
        the schedule over the run's total steps, fp16's GradScaler (disabled otherwise)."""
        c = self.config
        train_model = distributed.wrap(self.model, self.device, c.find_unused_parameters)
        optimizer = adamw(self.model, c, self.device)
        # without max_steps, the epochs' own batch counts make the total (they vary with token-budget
        # batching); the batches are made once, kept for the loop
        shards = {} if c.max_steps else {e: self._shard(e) for e in range(c.epochs)}
        total = c.max_steps or sum(math.ceil(len(batches) / c.grad_accum) for batches in shards.values())
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(c.schedule, c.warmup_steps, total, c.min_lr_ratio)
        )
        scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        return Run(train_model, optimizer, scheduler, scaler, total, shards)

    def _resume(self, run: Run, state: dict[str, Any]) -> None:
        """Continue from ``last/``'s state: optimizer, schedule, scaler, data position, best
        evaluation, RNG. A run that stopped early stays stopped, unless its ``patience`` now allows
        more evaluations without improvement (or is 0)."""
        restore(run, state, self.device, str(self.out_dir / "last"))
        if not (self.config.patience and run.evals_without_improvement >= self.config.patience):
            run.stopped_early = None

    def _next_group(self, run: Run) -> list[Any]:
        """The micro-batches of the next optimizer step (this rank's); an epoch's are drawn at its
        first step, in groups of ``grad_accum``."""
        if run.groups is None:
            batches = run.shards.pop(run.epoch) if run.epoch in run.shards else self._shard(run.epoch)
            accum = self.config.grad_accum
            run.groups = [batches[i : i + accum] for i in range(0, len(batches), accum)]
        return run.groups[run.next_group]

    def _optimisation_step(self, run: Run, group: list[Any]) -> float | None:
        """One optimizer step on one accumulation group: the gradients of its micro-batches,
        clipped, applied through the GradScaler; then the schedule's step. The data position moves
        on either way.

        Returns the step's loss (the mean of the micro-batches' mean losses; under torchrun, the
        mean over ranks), or None when fp16's GradScaler skipped the step (overflow).
        """
        loss = self._accumulate_gradients(run, group)
        if self.config.grad_clip is not None:
            run.scaler.unscale_(run.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        overflowed = optimizer_step(run.scaler, run.optimizer)
        self._advance(run)
        if overflowed:
            self._count_skipped_step(run, loss)
            return None
        run.consecutive_skips = 0
        run.lr = run.optimizer.param_groups[0]["lr"]  # this step's (scheduler.step sets the next one's)
        run.scheduler.step()
        run.step += 1
        run.losses.append(loss)
        run.bar.update(1)
        return loss

    def _accumulate_gradients(self, run: Run, group: list[Any]) -> float:
        """Forward and backward of each micro-batch of ``group``, its loss divided by ``len(group)``
        (scaled by the GradScaler under fp16), so the gradients add up to those of the mean loss.
        Counts the items (of all ranks) into the throughput window; returns the mean loss."""
        # Under DDP, gradients are averaged across ranks during the backward of the group's last
        # micro-batch only; before it they just accumulate locally.
        ddp = run.train_model if isinstance(run.train_model, DistributedDataParallel) else None
        loss_sum, items_sum = 0.0, 0
        for i, micro in enumerate(group):
            with ddp.no_sync() if ddp is not None and i < len(group) - 1 else nullcontext():
                with self._autocast():
                    loss, items = self.task.loss(run.train_model, micro, self.device)
                value = loss.item()
                if (
                    not math.isfinite(value) and not run.scaler.is_enabled()
                ):  # fp16: the scaler skips the step
                    raise FloatingPointError(
                        f"loss is {value} at step {run.step + 1} (epoch {run.epoch}, batch {run.next_group}"
                        + (f", rank {self.world.rank}" if self.world.distributed else "")
                        + "); training stopped: lower the learning rate, or check the data"
                    )
                run.scaler.scale(loss / len(group)).backward()
            loss_sum += value / len(group)
            items_sum += items
        if self.world.distributed:  # the mean loss over ranks, the items of all ranks
            loss_sum, global_items = distributed.all_reduce_sum([loss_sum, items_sum], self.device)
            loss_sum /= self.world.size
            run.window_items += global_items
        else:
            run.window_items += items_sum
        return loss_sum

    def _advance(self, run: Run) -> None:
        """Move the data position to the next accumulation group (after an epoch's last, to the
        next epoch's first)."""
        assert run.groups is not None  # (drawn by _next_group)
        run.next_group += 1
        if run.next_group >= len(run.groups):
            run.epoch, run.next_group, run.groups = run.epoch + 1, 0, None

    def _count_skipped_step(self, run: Run, loss: float) -> None:
        """fp16: the GradScaler skipped a step (overflow); too many in a row stop training."""
        run.skipped += 1
        run.consecutive_skips += 1
        if run.consecutive_skips > MAX_CONSECUTIVE_SKIPS:
            raise FloatingPointError(
                f"fp16: {run.consecutive_skips} optimizer steps in a row overflowed "
                f"(loss {loss}); training stopped: try bf16 or a lower learning rate"
            )

    def _log(self, run: Run, loss: float) -> None:
        """A training record (rank 0 writes it: metrics.jsonl, and TensorBoard when asked), the
        progress bar's numbers, and a new throughput window."""
        elapsed = time.perf_counter() - run.window_start
        record = {
            "step": run.step,
            "epoch": run.epoch,
            "loss": loss,
            "lr": run.lr,
            "items_per_s": run.window_items / max(elapsed, 1e-9),  # all ranks together
        }
        if run.scaler.is_enabled():
            record["skipped_steps"] = run.skipped  # fp16 overflows so far (the scaler's calibration)
        train_metrics = getattr(self.task, "train_metrics", None)  # optional: the task's own numbers
        if train_metrics is not None:
            record.update(train_metrics())  # since its last log (rank 0's batches under torchrun)
        if self.world.is_main:
            self.log.write(record)
        run.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{run.lr:.2e}", tok_s=f"{record['items_per_s']:.0f}")
        run.window_items, run.window_start = 0.0, time.perf_counter()

    def _evaluate_and_save(self, run: Run) -> None:
        """Evaluate (rank 0; every rank gets its metrics), save ``best/`` when ``best_metric``
        improves (and a ``step-`` snapshot when keeping them), log the metrics, redraw the curves,
        and stop early when ``patience`` evaluations in a row brought no improvement."""
        c = self.config
        metrics = distributed.on_main(self.evaluate)  # every rank gets rank 0's metrics
        run.evals.append({"step": run.step, **metrics})
        improved = run.best is None or self._better(metrics[c.best_metric], run.best[c.best_metric])
        if improved:
            run.best = {"step": run.step, **metrics}
            self.save("best", None)
        run.evals_without_improvement = 0 if improved else run.evals_without_improvement + 1
        if self.world.is_main:
            self.log.write({"step": run.step, **{f"eval/{k}": v for k, v in metrics.items()}})
            if c.keep_checkpoints:
                self._keep_snapshot(run.step)
            if c.progress:
                run.bar.write(
                    f"step {run.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
                    file=sys.stderr,
                )
            plot_curves(self.log.records(), self.out_dir / "curves.png")
        if c.patience and run.evals_without_improvement >= c.patience and run.step < run.total:
            self._stop_early(run)

    def _keep_snapshot(self, step: int) -> None:
        """Save the weights as ``step-NNNNNNN/``, keeping the last ``keep_checkpoints`` of them."""
        self.save(f"step-{step:07d}", None)
        for old in sorted(self.out_dir.glob("step-*"))[: -self.config.keep_checkpoints]:
            shutil.rmtree(old)

    def _stop_early(self, run: Run) -> None:
        """End the run here (``patience`` is out): the loop stops, ``last/`` is saved at this step,
        and the log says so: ``{"step": s, "early_stop": {"best_step": b, "patience": n}}``."""
        assert run.best is not None  # (the first evaluation is always an improvement)
        run.stopped_early = {
            "step": run.step,
            "best_step": run.best["step"],
            "patience": self.config.patience,
        }
        if self.world.is_main:
            self.log.write(
                {
                    "step": run.step,
                    "early_stop": {"best_step": run.best["step"], "patience": self.config.patience},
                }
            )
            if self.config.progress:
                run.bar.write(
                    f"step {run.step}: stopping early: {self.config.best_metric} has not improved in "
                    f"{self.config.patience} evaluations (best at step {run.best['step']})",
                    file=sys.stderr,
                )

    def _finish(self, run: Run) -> TrainResult:
        if run.bar is not None:
            run.bar.close()
        distributed.barrier()  # when fit returns on any rank, rank 0's checkpoints are written
        return TrainResult(
            step=run.step,
            losses=run.losses,
            evals=run.evals,
            best=run.best,
            seconds=time.perf_counter() - run.start,
            skipped_steps=run.skipped,
            stopped_early=run.stopped_early,
        )

    # ---- helpers of the run: data shards, resumption ------------------------------------------

    def _shard(self, epoch: int) -> list[Any]:
        """This rank's micro-batches of ``epoch`` (all of them in a single process)."""
        batches = self.task.batches(epoch, self.config.seed)
        if not batches:
            raise ValueError(f"the task produced no training batches for epoch {epoch}")
        if self.world.distributed:
            batches = distributed.shard(batches, self.world.rank, self.world.size)
        return batches

    def _resume_state(self) -> dict[str, Any]:
        """``last/``'s training state, read by rank 0 and broadcast (other machines need no copy),
        with this rank's RNG state under "rng"; the weights are loaded on rank 0 (DDP copies them).
        Read into CPU memory (the optimizer moves its state to the parameters' device)."""
        last = self.out_dir / "last"

        def read() -> dict[str, Any]:
            check_same_run(last, self.config, self.task.checkpoint_config())
            return load_training_state(last, map_location="cpu")

        state = distributed.on_main(read)
        saved_size = state.get("world_size", 1)
        if saved_size != self.world.size:
            raise ValueError(
                f"{last} was saved by {saved_size} process(es) and cannot resume with {self.world.size}: "
                "each rank's position in the epoch and its RNG state depend on the number of processes"
            )
        if self.world.is_main:
            load_weights(self.model, last)
            finish_interrupted_save(last)
        if "rng_ranks" in state:
            state["rng"] = state["rng_ranks"][self.world.rank]
        return state
