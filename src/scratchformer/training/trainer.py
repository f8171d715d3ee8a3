"""The training loop shared by every task (classification, translation, captioning).

A task supplies the data and the loss (:class:`TrainingTask`); the :class:`Trainer` supplies
AdamW, warm-up + decay, gradient clipping and accumulation, mixed precision, periodic evaluation,
the best and the last checkpoint, a JSONL log, a loss-curve PNG, and exact resumption.

Under ``torchrun`` the same loop runs in every process (data parallelism, see
:mod:`scratchformer.training.distributed`): the model is wrapped in ``DistributedDataParallel``,
each rank trains on its share of every epoch's micro-batches, gradients are averaged across ranks
(only on the last micro-batch of an accumulation group: ``no_sync`` before it), the logged loss
and throughput are combined over all ranks, rank 0 evaluates and tells the others the result, and
rank 0 alone writes the log, the curves and the checkpoints.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import os
import random
import shutil
import sys
import time
import types
import typing
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from scratchformer.training import distributed
from scratchformer.training.checkpoint import (
    average_checkpoints,
    finish_interrupted_save,
    load_config,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from scratchformer.training.metrics import MetricsLog, plot_curves
from scratchformer.training.schedule import SCHEDULES, lr_multiplier

__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingTask", "resolve_device"]

PRECISIONS = ("fp32", "bf16", "fp16")
MAX_CONSECUTIVE_SKIPS = 20  # fp16 overflows in a row before training stops
FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # torch's fused AdamW kernel (one pass over all parameters) runs there
# TrainConfig's integer counts and their least values (seed may be any integer, max_steps also None)
AT_LEAST = {"epochs": 1, "max_steps": 1, "grad_accum": 1, "log_every": 1, "eval_every": 0, "save_every": 0,
            "keep_checkpoints": 0, "warmup_steps": 0, "threads": 0}
# TrainConfig fields that fix the data order and the optimisation: a resumed run keeps the saved ones
# (its length, device, precision, logging and saving may change)
RESUME_FIXED = ("seed", "grad_accum", "lr", "betas", "adam_eps", "weight_decay", "schedule", "warmup_steps",
                "min_lr_ratio")
TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}


@dataclass
class TrainConfig:
    """How to train (the task decides what).

    Attributes:
        out_dir: where checkpoints (``best/``, ``last/``), ``metrics.jsonl`` and ``curves.png`` go.
        epochs: passes over the training data, unless ``max_steps`` is set (>= 1).
        max_steps: optimizer steps in total (also the decay horizon of the schedule); None: ``epochs``
            decide.
        lr: peak learning rate (> 0).
        weight_decay: AdamW decay of weight matrices (not biases/norms), >= 0.
        betas: AdamW's two moment coefficients, each in [0, 1).
        adam_eps: AdamW's epsilon (> 0).
        schedule: "cosine", "inverse_sqrt", "linear" or "constant", after ``warmup_steps``.
        warmup_steps: optimizer steps of linear warm-up from ~0 to ``lr`` (>= 0).
        min_lr_ratio: floor of cosine/linear decay, as a fraction of ``lr``, in [0, 1].
        grad_clip: max global gradient norm, > 0 (None: no clipping).
        grad_accum: micro-batches per optimizer step (>= 1).
        precision: "fp32", "bf16" (autocast; CPU or GPU) or "fp16" (autocast + GradScaler; GPU).
        eval_every: evaluate every N steps (0: only at the end); the best checkpoint is kept.
        best_metric: which evaluation metric picks the best checkpoint (one the task reports).
        best_mode: "max" (higher ``best_metric`` is better) or "min".
        save_every: write the resumable ``last/`` checkpoint every N steps (0: only at the end).
        keep_checkpoints: also keep the last N evaluated weights as ``step-NNNNNNN/`` (for
            checkpoint averaging; 0: none).
        log_every: steps between log lines (>= 1).
        seed: everything random derives from it.
        device: "auto" (CUDA if available), "cpu", "cuda", "cuda:1", ... (under torchrun: "auto",
            "cpu" or "cuda", and each process takes cuda:LOCAL_RANK).
        threads: torch CPU threads (0: torch's default; torchrun sets 1 per process).
        progress: show a progress bar (rank 0 only).
        find_unused_parameters: under torchrun, tell DistributedDataParallel that some parameters
            may get no gradient in a step (slower; needed only by models that skip parameters).
        overwrite: a fresh run into an ``out_dir`` that holds an earlier run replaces it (its
            checkpoints, log and report); without it that is an error (resume, or pick another).
        deterministic: ``torch.use_deterministic_algorithms(True)``. A resumed run equals the
            uninterrupted one bit for bit on CPU without it; on CUDA it needs it (the fused
            attention backward and ``index_add`` are not deterministic there), at some speed.

    Under torchrun with N processes, one optimizer step consumes ``N * grad_accum`` micro-batches
    (the effective batch is N times larger, so an epoch has N times fewer steps); the learning
    rate is not rescaled for you.
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
    find_unused_parameters: bool = False
    overwrite: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            self.betas = tuple(self.betas)  # type: ignore[assignment]  # JSON gives a list
        if isinstance(self.out_dir, os.PathLike):
            self.out_dir = os.fspath(self.out_dir)  # (saved in config.json)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode: expected 'min' or 'max', got {self.best_mode!r}")
        for name, least in AT_LEAST.items():  # epochs=1.5 would never reach its last step (nor save it)
            value = getattr(self, name)
            if not (name == "max_steps" and value is None) and (
                    isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        for name, hint in typing.get_type_hints(TrainConfig).items():  # a JSON recipe may hold "lr": "1e-3"
            value = getattr(self, name)
            if not _fits(value, hint):
                raise ValueError(f"{name} must be {_describe(hint)}, got {value!r}")
            if isinstance(value, numbers.Number) and not isinstance(value, (bool, int, float)):  # numpy's: JSON
                setattr(self, name, int(value) if isinstance(value, numbers.Integral) else float(value))  # needs ours
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive (or null: no clipping), got {self.grad_clip}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not self.weight_decay >= 0 or not self.adam_eps > 0:
            raise ValueError(f"weight_decay must be >= 0 and adam_eps > 0, got {self.weight_decay}, {self.adam_eps}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint``: an integer is a float, a bool is no number,
    a path is a string."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in args)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and len(value) == len(args) and all(map(_fits, value, args))
    if isinstance(value, bool):
        return hint is bool
    return isinstance(value, {int: numbers.Integral, float: numbers.Real, str: (str, os.PathLike)}.get(hint, hint))


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """A JSON value's leaves by dotted path: {"model": {"num_heads": 2}} -> {"model.num_heads": 2}."""
    if not isinstance(value, dict) or not value:
        return {path: value}
    return {k: v for key, item in value.items() for k, v in _leaves(item, f"{path}.{key}" if path else key).items()}


def _describe(hint: Any) -> str:
    """``hint`` in words: "an integer or null", "[a number, a number]"."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, args))
    if typing.get_origin(hint) is tuple:
        return f"[{', '.join(map(_describe, args))}]"
    return TYPE_NAMES[hint]


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
    step: int
    losses: list[float]  # one per optimizer step run by this call
    evals: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] | None = None
    seconds: float = 0.0
    skipped_steps: int = 0  # fp16: optimizer steps the GradScaler skipped (overflow); not counted in step


RUN_OUTPUTS = ("last", "last.old", "best", "best.old", "averaged", "metrics.jsonl", "report.json", "curves.png", "encoder")


def earlier_run(out_dir: str | Path) -> list[str]:
    """What an earlier run left in ``out_dir`` (checkpoints, log, report, test outputs)."""
    out = Path(out_dir)
    return sorted(p.name for p in out.glob("*") if p.name in RUN_OUTPUTS or p.name.startswith("step-")
                  or p.name.endswith(("_hypotheses.txt", "_captions.txt"))) if out.is_dir() else []


def check_run(config: TrainConfig, resume: bool) -> None:
    """What a run needs before any work starts (the tasks call this first; so does the Trainer):
    the device exists, the precision suits it, and ``out_dir`` is fit for a fresh run (no earlier
    run there, unless ``overwrite``: the Trainer removes it when training starts) or for
    ``resume``. The output directory is rank 0's (other machines need no copy): rank 0 checks it
    and every rank gets its verdict."""
    device = resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise ValueError("precision 'fp16' needs a CUDA device (GradScaler); use 'bf16' on CPU")
    distributed.on_main(lambda: _check_out_dir(Path(config.out_dir), resume, config.overwrite))


def _check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    if resume:
        if not (out / "last" / "training_state.pt").is_file() and not (out / "last.old" / "training_state.pt").is_file():
            raise FileNotFoundError(f"--resume: no resumable checkpoint in {out} (expected {out / 'last'})")
    elif earlier_run(out) and not overwrite:
        raise FileExistsError(f"{out} holds an earlier run ({', '.join(earlier_run(out))}): resume it (--resume), "
                              "replace it (--overwrite / overwrite=True) or choose another output directory")


def resolve_device(name: str) -> torch.device:
    """The device ``name`` means for this process (under torchrun: its own GPU, cuda:LOCAL_RANK)."""
    here = distributed.world()
    return distributed.device_for(name, here.local_rank, here.distributed)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay weight matrices and embeddings (dim >= 2); never biases or LayerNorm gains."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def optimizer_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """One optimizer step through the GradScaler (a plain step when it is disabled), then zero the
    gradients. Returns whether the scaler skipped it: inf/NaN gradients (fp16 overflow, or its
    first calibration steps) make it lower the scale and leave the weights unchanged."""
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scale is not None and scaler.get_scale() < scale


def _rng_state(device: torch.device) -> dict[str, Any]:
    """The CPU and Python generators, and the generator of the GPU this process trains on (only
    that one: a resumed run may see fewer GPUs)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if device.type == "cuda" and cuda is not None:
        if isinstance(cuda, list):  # saved by 0.1: every visible GPU's state; take this device's
            cuda = cuda[device.index or 0] if (device.index or 0) < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


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
        """Write the model as checkpoint ``out_dir/name`` (atomically), with the task's files.
        Under torchrun only rank 0 writes (every rank holds the same weights)."""
        if not self.world.is_main:
            return
        config = dict(self.task.checkpoint_config(), training=asdict(self.config))
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
            warnings.warn(f"average_last={n}: the run kept only {len(snapshots)} evaluated checkpoint(s), one per "
                          f"evaluation (eval_every={self.config.eval_every}); averaging {len(snapshots)}",
                          stacklevel=2)
        average_checkpoints(snapshots, self.model)
        metrics = {"checkpoints": len(snapshots), **self.evaluate()}
        key = self.config.best_metric
        at_least_as_good = best is None or (
            metrics[key] >= best[key] if self.config.best_mode == "max" else metrics[key] <= best[key]
        )
        if at_least_as_good:
            self.save("averaged")
        return ("averaged" if at_least_as_good else "best"), metrics

    def _shard(self, epoch: int) -> list[Any]:
        """This rank's micro-batches of ``epoch`` (all of them in a single process)."""
        batches = self.task.batches(epoch, self.config.seed)
        if not batches:
            raise ValueError(f"the task produced no training batches for epoch {epoch}")
        return distributed.shard(batches, self.world.rank, self.world.size) if self.world.distributed else batches

    def _resume_state(self) -> dict[str, Any]:
        """``last/``'s training state, read by rank 0 and broadcast (other machines need no copy),
        with this rank's RNG state under "rng"; the weights are loaded on rank 0 (DDP copies them).
        Read into CPU memory (the optimizer moves its state to the parameters' device)."""
        last = self.out_dir / "last"

        def read() -> dict[str, Any]:
            self._check_same_run(last)
            return load_training_state(last, map_location="cpu")

        state = distributed.on_main(read)
        saved_size = state.get("world_size", 1)
        if saved_size != self.world.size:
            raise ValueError(f"{last} was saved by {saved_size} process(es) and cannot resume with {self.world.size}: "
                             "each rank's position in the epoch and its RNG state depend on the number of processes")
        if self.world.is_main:
            load_weights(self.model, last)
            finish_interrupted_save(last)
        if "rng_ranks" in state:
            state["rng"] = state["rng_ranks"][self.world.rank]
        return state

    def _check_same_run(self, last: Path) -> None:
        """Refuse to resume ``last`` with another task or model configuration, or other values of
        the training fields in RESUME_FIXED (only those the saved file holds: older ones resume)."""
        saved = load_config(last)
        saved_training = saved.pop("training", {})
        saved.pop("weights_sha256", None)
        training = json.loads(json.dumps(asdict(self.config)))
        now = {**_leaves(json.loads(json.dumps(self.task.checkpoint_config()))),
               **{k: training[k] for k in RESUME_FIXED}}
        was = {**_leaves(saved), **{k: saved_training[k] for k in RESUME_FIXED if k in saved_training}}
        differ = [k for k in was if k not in now or now[k] != was[k]]
        if differ:
            def show(values: dict[str, Any]) -> str:
                return ", ".join(f"{k}={json.dumps(values[k])}" if k in values else f"no {k}" for k in differ)
            raise ValueError(f"{last} was saved with {show(was)}; this run has {show(now)}: --resume continues a run "
                             "with its own settings (only its length, device, precision, logging and saving may change)")

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The module the training steps call: ``DistributedDataParallel(model)`` under torchrun.

        DDP copies rank 0's parameters to every rank here. Buffers are not broadcast at every
        forward: our models' buffers are fixed tables (positional encodings), never statistics.
        """
        if not self.world.distributed:
            return model
        no_buffer_sync: dict[str, Any] = (  # newer PyTorch renamed broadcast_buffers
            {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}
        )
        return DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=self.config.find_unused_parameters,
            **no_buffer_sync,
        )

    def fit(self, resume: bool = False, on_step: Any = None) -> TrainResult:
        """Train (see :meth:`_fit`); with ``deterministic`` under deterministic algorithms, the
        process's previous setting restored afterwards."""
        if not self.config.deterministic:
            return self._fit(resume, on_step)
        previous = torch.are_deterministic_algorithms_enabled()
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True)
        try:
            return self._fit(resume, on_step)
        finally:
            torch.use_deterministic_algorithms(previous)

    def _fit(self, resume: bool = False, on_step: Any = None) -> TrainResult:
        """Train to ``max_steps`` (or ``epochs``). ``resume`` continues from ``out_dir/last``.

        ``on_step(step, loss)`` is called after every optimizer step (e.g. to stop early); under
        torchrun ``loss`` (as ``TrainResult.losses``) is the mean over all ranks, the same everywhere.

        Under torchrun, every rank starts from rank 0's weights and draws its own random numbers
        (dropout) from ``seed + rank``; rank 0's stream is the one a single process would draw.
        """
        c = self.config
        main = self.world.is_main
        if c.threads:
            torch.set_num_threads(c.threads)
        torch.manual_seed(c.seed + self.world.rank)
        random.seed(c.seed + self.world.rank)
        model = self.model.to(self.device)
        model.train()
        check_run(c, resume)  # (the tasks ran it already, before their data work)
        if not resume and c.overwrite and main:  # replace the earlier run now that this one starts
            for name in earlier_run(self.out_dir):
                path = self.out_dir / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        state = self._resume_state() if resume else None
        train_model = self._wrap(model)
        ddp = train_model if isinstance(train_model, DistributedDataParallel) else None
        optimizer = torch.optim.AdamW(_param_groups(model, c.weight_decay), lr=c.lr, betas=c.betas, eps=c.adam_eps,
                                      fused=self.device.type in FUSED_ADAMW_DEVICES)
        # without max_steps, the epochs' own batch counts make the total (they vary with token-budget
        # batching); the batches are made once, kept for the loop
        shards = {} if c.max_steps else {e: self._shard(e) for e in range(c.epochs)}
        total = c.max_steps or sum(math.ceil(len(batches) / c.grad_accum) for batches in shards.values())
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(c.schedule, c.warmup_steps, total, c.min_lr_ratio)
        )
        scaler = torch.amp.GradScaler("cuda", enabled=c.precision == "fp16")

        step, epoch, next_group, best, skipped = 0, 0, 0, None, 0
        if state is not None:
            saved = [len(g["params"]) for g in state["optimizer"]["param_groups"]]
            if saved != [len(g["params"]) for g in optimizer.param_groups]:
                raise ValueError(f"{self.out_dir / 'last'}: its optimizer state holds {saved} parameter tensors per group, "
                                 f"this model has {[len(g['params']) for g in optimizer.param_groups]} (saved by another "
                                 "model or release); its weights load, but the run cannot resume")
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if scaler.is_enabled() and state.get("scaler"):  # (a bf16/fp32 run saved an empty scaler state)
                scaler.load_state_dict(state["scaler"])
            step, epoch, next_group, best = state["step"], state["epoch"], state["next_group"], state["best"]
            skipped = state.get("skipped_steps", 0)
            _set_rng_state(state["rng"], self.device)
            if main:
                self.log.truncate_after(step)
        elif main and self.log.path.exists():
            self.log.path.unlink()  # a fresh run starts a fresh log

        def training_state() -> dict[str, Any]:
            """The resumable state; a collective under torchrun (every rank's RNG state is gathered)."""
            rng = _rng_state(self.device)
            state = {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "step": step,
                "epoch": epoch,
                "next_group": next_group,
                "best": best,
                "skipped_steps": skipped,
                "rng": rng,
                "world_size": self.world.size,
            }
            if self.world.distributed:
                state["rng_ranks"] = distributed.all_gather_object(rng)
            return state

        result = TrainResult(step=step, losses=[])
        consecutive_skips = 0
        start = time.perf_counter()
        window_items, window_start = 0.0, time.perf_counter()
        show = c.progress and main
        bar = tqdm(total=total, initial=step, desc="training", unit="step", disable=not show, mininterval=1.0)
        while step < total:
            batches = shards.pop(epoch) if epoch in shards else self._shard(epoch)
            groups = [batches[i : i + c.grad_accum] for i in range(0, len(batches), c.grad_accum)]
            epoch_done = False
            while not epoch_done and step < total:
                group = groups[next_group]
                loss_sum, items_sum = 0.0, 0
                for i, micro in enumerate(group):
                    # Under DDP, gradients are averaged across ranks during the backward of the
                    # group's last micro-batch only; before it they just accumulate locally.
                    sync = ddp.no_sync() if ddp is not None and i < len(group) - 1 else nullcontext()
                    with sync:
                        with self._autocast():
                            loss, items = self.task.loss(train_model, micro, self.device)
                        value = loss.item()
                        if not math.isfinite(value) and not scaler.is_enabled():  # fp16: the scaler skips the step
                            raise FloatingPointError(
                                f"loss is {value} at step {step + 1} (epoch {epoch}, batch {next_group}"
                                + (f", rank {self.world.rank}" if self.world.distributed else "")
                                + "); training stopped: lower the learning rate, or check the data"
                            )
                        scaler.scale(loss / len(group)).backward()
                    loss_sum += value / len(group)
                    items_sum += items
                if self.world.distributed:  # the mean loss over ranks, the items of all ranks
                    loss_sum, global_items = distributed.all_reduce_sum([loss_sum, items_sum], self.device)
                    loss_sum /= self.world.size
                    window_items += global_items
                else:
                    window_items += items_sum
                if c.grad_clip is not None:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
                overflowed = optimizer_step(scaler, optimizer)
                next_group += 1
                epoch_done = next_group >= len(groups)
                if epoch_done:
                    epoch, next_group = epoch + 1, 0
                if overflowed:  # fp16: the scaler skipped this step
                    skipped += 1
                    consecutive_skips += 1
                    if consecutive_skips > MAX_CONSECUTIVE_SKIPS:
                        raise FloatingPointError(f"fp16: {consecutive_skips} optimizer steps in a row overflowed "
                                                 f"(loss {loss_sum}); training stopped: try bf16 or a lower learning rate")
                    continue  # not a step: the schedule, the step count and the log do not move
                consecutive_skips = 0
                lr = optimizer.param_groups[0]["lr"]  # this step's (scheduler.step sets the next one's)
                scheduler.step()
                step += 1
                result.losses.append(loss_sum)
                bar.update(1)

                if step % c.log_every == 0 or step == total:
                    elapsed = time.perf_counter() - window_start
                    record = {
                        "step": step,
                        "epoch": epoch,
                        "loss": loss_sum,
                        "lr": lr,
                        "items_per_s": window_items / max(elapsed, 1e-9),  # all ranks together
                    }
                    if scaler.is_enabled():
                        record["skipped_steps"] = skipped  # fp16 overflows so far (the scaler's calibration)
                    if main:
                        self.log.write(record)
                    bar.set_postfix(loss=f"{loss_sum:.4f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['items_per_s']:.0f}")
                    window_items, window_start = 0.0, time.perf_counter()

                if (c.eval_every and step % c.eval_every == 0) or step == total:
                    metrics = distributed.on_main(self.evaluate)  # every rank gets rank 0's metrics
                    result.evals.append({"step": step, **metrics})
                    value = metrics[c.best_metric]
                    if best is None or (value > best[c.best_metric] if c.best_mode == "max" else value < best[c.best_metric]):
                        best = {"step": step, **metrics}
                        self.save("best", None)
                    if main:
                        self.log.write({"step": step, **{f"eval/{k}": v for k, v in metrics.items()}})
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
        distributed.barrier()  # when fit returns on any rank, rank 0's checkpoints are written
        result.step, result.best, result.seconds, result.skipped_steps = step, best, time.perf_counter() - start, skipped
        return result
