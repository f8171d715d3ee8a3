"""The training loop shared by every task (classification, translation, captioning).

A task supplies the data and the loss (:class:`TrainingTask`); the :class:`Trainer` supplies
AdamW, warm-up + decay, gradient clipping and accumulation, mixed precision, periodic evaluation,
the best and the last checkpoint, a JSONL log, a loss-curve PNG, and exact resumption.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from scratchformer.training.checkpoint import (
    average_checkpoints,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from scratchformer.training.metrics import MetricsLog, plot_curves
from scratchformer.training.schedule import SCHEDULES, lr_multiplier

__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingTask", "resolve_device"]

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainConfig:
    """How to train (the task decides what).

    Attributes:
        out_dir: where checkpoints (``best/``, ``last/``), ``metrics.jsonl`` and ``curves.png`` go.
        epochs: passes over the training data, unless ``max_steps`` is set.
        max_steps: optimizer steps in total (also the decay horizon of the schedule).
        lr: peak learning rate.  weight_decay: AdamW decay of weight matrices (not biases/norms).
        betas, adam_eps: AdamW moments.
        schedule: "cosine", "inverse_sqrt", "linear" or "constant", after ``warmup_steps``.
        min_lr_ratio: floor of cosine/linear decay, as a fraction of ``lr``.
        grad_clip: max global gradient norm (None: no clipping).
        grad_accum: micro-batches per optimizer step.
        precision: "fp32", "bf16" (autocast; CPU or GPU) or "fp16" (autocast + GradScaler; GPU).
        eval_every: evaluate every N steps (0: only at the end); the best checkpoint is kept.
        best_metric, best_mode: which evaluation metric picks the best checkpoint, "max" or "min".
        save_every: write the resumable ``last/`` checkpoint every N steps (0: only at the end).
        keep_checkpoints: also keep the last N evaluated weights as ``step-NNNNNNN/`` (for
            checkpoint averaging; 0: none).
        log_every: steps between log lines.  seed: everything random derives from it.
        device: "auto" (CUDA if available), "cpu", "cuda", "cuda:1", ...
        threads: torch CPU threads (0: torch's default).  progress: show a progress bar.
    """

    out_dir: str = "runs/run"
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    precision: str = "fp32"
    eval_every: int = 0
    best_metric: str = "loss"
    best_mode: str = "min"
    save_every: int = 0
    keep_checkpoints: int = 0
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    threads: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # JSON gives a list
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode: expected 'min' or 'max', got {self.best_mode!r}")
        for name in ("epochs", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


class TrainingTask(Protocol):
    """What the trainer needs from a task."""

    def batches(self, epoch: int, seed: int) -> list[Any]:
        """The micro-batches of one epoch, in order; the same for the same (epoch, seed)."""
        ...

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        """Mean loss of one micro-batch, and how many items (tokens) it covered."""
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation metrics (model already in eval mode, no grad)."""
        ...

    def checkpoint_config(self) -> dict[str, Any]:
        """The JSON-able description saved as the checkpoint's config.json."""
        ...

    def save_files(self, directory: Path) -> None:
        """Write extra checkpoint files (the tokenizer) into ``directory``."""
        ...


@dataclass
class TrainResult:
    step: int
    losses: list[float]  # one per optimizer step run by this call
    evals: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] | None = None
    seconds: float = 0.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested, but CUDA is not available")
    return device


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay weight matrices and embeddings (dim >= 2); never biases or LayerNorm gains."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        self.device = resolve_device(config.device)
        if config.precision == "fp16" and self.device.type != "cuda":
            raise ValueError("precision 'fp16' needs a CUDA device (GradScaler); use 'bf16' on CPU")
        self.log = MetricsLog(self.out_dir / "metrics.jsonl")

    def _autocast(self) -> torch.autocast:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.config.precision)
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def evaluate(self) -> dict[str, float]:
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), self._autocast():
            metrics = self.task.evaluate(self.model, self.device)
        self.model.train(was_training)
        return metrics

    def save(self, name: str, training_state: dict[str, Any] | None = None) -> None:
        """Write the model as checkpoint ``out_dir/name`` (atomically), with the task's files."""
        config = dict(self.task.checkpoint_config(), training=asdict(self.config))
        save_checkpoint(self.out_dir / name, self.model, config, training_state, self.task.save_files)

    def average_last(self, n: int, best: dict[str, float] | None) -> tuple[str, dict[str, float]]:
        """Load the mean of the last ``n`` kept snapshots into the model and evaluate it; save it
        as ``averaged/`` if it is at least as good as ``best`` on ``best_metric``.

        Returns the name of the checkpoint to use ("averaged" or "best") and the averaged metrics.
        """
        snapshots = sorted(self.out_dir.glob("step-*"))[-n:]
        if not snapshots:
            raise ValueError(f"no step-* snapshots in {self.out_dir} to average (set keep_checkpoints)")
        average_checkpoints(snapshots, self.model)
        metrics = self.evaluate()
        key = self.config.best_metric
        at_least_as_good = best is None or (
            metrics[key] >= best[key] if self.config.best_mode == "max" else metrics[key] <= best[key]
        )
        if at_least_as_good:
            self.save("averaged")
        return ("averaged" if at_least_as_good else "best"), metrics

    def fit(self, resume: bool = False, on_step: Any = None) -> TrainResult:
        """Train to ``max_steps`` (or ``epochs``). ``resume`` continues from ``out_dir/last``.

        ``on_step(step, loss)`` is called after every optimizer step (e.g. to stop early).
        """
        c = self.config
        if c.threads:
            torch.set_num_threads(c.threads)
        torch.manual_seed(c.seed)
        random.seed(c.seed)
        model = self.model.to(self.device)
        model.train()
        optimizer = torch.optim.AdamW(_param_groups(model, c.weight_decay), lr=c.lr, betas=c.betas, eps=c.adam_eps)
        groups_per_epoch = math.ceil(len(self.task.batches(0, c.seed)) / c.grad_accum)
        total = c.max_steps or c.epochs * groups_per_epoch
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(c.schedule, c.warmup_steps, total, c.min_lr_ratio)
        )
        scaler = torch.amp.GradScaler("cuda", enabled=c.precision == "fp16")

        step, epoch, next_group, best = 0, 0, 0, None
        if resume:
            state = load_training_state(self.out_dir / "last")
            load_weights(model, self.out_dir / "last")
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            step, epoch, next_group, best = state["step"], state["epoch"], state["next_group"], state["best"]
            _set_rng_state(state["rng"])
            self.log.truncate_after(step)
        elif self.log.path.exists():
            self.log.path.unlink()  # a fresh run starts a fresh log

        def training_state() -> dict[str, Any]:
            return {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "step": step,
                "epoch": epoch,
                "next_group": next_group,
                "best": best,
                "rng": _rng_state(),
            }

        result = TrainResult(step=step, losses=[])
        start = time.perf_counter()
        window_items, window_start = 0, time.perf_counter()
        bar = tqdm(total=total, initial=step, desc="training", unit="step", disable=not c.progress, mininterval=1.0)
        while step < total:
            batches = self.task.batches(epoch, c.seed)
            groups = [batches[i : i + c.grad_accum] for i in range(0, len(batches), c.grad_accum)]
            if not groups:
                raise ValueError(f"the task produced no training batches for epoch {epoch}")
            epoch_done = False
            while not epoch_done and step < total:
                group = groups[next_group]
                loss_sum = 0.0
                for micro in group:
                    with self._autocast():
                        loss, items = self.task.loss(model, micro, self.device)
                    value = loss.item()
                    if not math.isfinite(value):
                        raise FloatingPointError(
                            f"loss is {value} at step {step + 1} (epoch {epoch}, batch {next_group}); "
                            "training stopped: lower the learning rate, or check the data"
                        )
                    scaler.scale(loss / len(group)).backward()
                    loss_sum += value / len(group)
                    window_items += items
                if c.grad_clip is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                next_group += 1
                epoch_done = next_group >= len(groups)
                if epoch_done:
                    epoch, next_group = epoch + 1, 0
                result.losses.append(loss_sum)
                bar.update(1)

                if step % c.log_every == 0 or step == total:
                    elapsed = time.perf_counter() - window_start
                    record = {
                        "step": step,
                        "epoch": epoch,
                        "loss": loss_sum,
                        "lr": scheduler.get_last_lr()[0],
                        "items_per_s": window_items / max(elapsed, 1e-9),
                    }
                    self.log.write(record)
                    bar.set_postfix(loss=f"{loss_sum:.4f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['items_per_s']:.0f}")
                    window_items, window_start = 0, time.perf_counter()

                if (c.eval_every and step % c.eval_every == 0) or step == total:
                    metrics = self.evaluate()
                    self.log.write({"step": step, **{f"eval/{k}": v for k, v in metrics.items()}})
                    result.evals.append({"step": step, **metrics})
                    value = metrics[c.best_metric]
                    if best is None or (value > best[c.best_metric] if c.best_mode == "max" else value < best[c.best_metric]):
                        best = {"step": step, **metrics}
                        self.save("best", None)
                    if c.keep_checkpoints:
                        self.save(f"step-{step:07d}", None)
                        for old in sorted(self.out_dir.glob("step-*"))[: -c.keep_checkpoints]:
                            shutil.rmtree(old)
                    if c.progress:
                        bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), file=sys.stderr)
                    plot_curves(self.log.records(), self.out_dir / "curves.png")

                if (c.save_every and step % c.save_every == 0) or step == total:
                    self.save("last", training_state())
                if on_step is not None:
                    on_step(step, loss_sum)
        bar.close()
        result.step, result.best, result.seconds = step, best, time.perf_counter() - start
        return result
