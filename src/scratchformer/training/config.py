"""How to train: :class:`TrainConfig`, a recipe's ``train`` section, checked when it is made."""

from __future__ import annotations

import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from scratchformer.training.schedule import SCHEDULES

__all__ = ["RESUME_FIXED", "TrainConfig"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "fp64")  # see training/precision.py
# TrainConfig's integer counts and their least values (seed may be any integer, max_steps also None)
AT_LEAST = {
    "epochs": 1,
    "max_steps": 1,
    "grad_accum": 1,
    "log_every": 1,
    "eval_every": 0,
    "save_every": 0,
    "keep_checkpoints": 0,
    "warmup_steps": 0,
    "threads": 0,
    "patience": 0,
}
# TrainConfig fields that fix the data order and the optimisation: a resumed run keeps the saved ones
# (its length, device, precision, logging, saving and patience may change)
RESUME_FIXED = (
    "seed",
    "grad_accum",
    "lr",
    "betas",
    "adam_eps",
    "weight_decay",
    "schedule",
    "warmup_steps",
    "min_lr_ratio",
)
TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


@dataclass
class TrainConfig:
    """How to train (the task decides what).

    Attributes:
        out_dir: where checkpoints (``best/``, ``last/``), ``metrics.jsonl`` and ``curves.png`` go.
        epochs: passes over the training data, unless ``max_steps`` is set (>= 1).
        max_steps: optimizer steps in total (also the decay horizon of the schedule); None: ``epochs``
            decide.
        lr: peak learning rate (> 0).
        lr_groups: parameters whose name starts with a key train at that key's peak learning rate
            instead of ``lr`` (the same schedule), e.g. {"image_top.": 1e-4}; each key must name some.
        weight_decay: AdamW decay of weight matrices (not biases/norms), >= 0.
        betas: AdamW's two moment coefficients, each in [0, 1).
        adam_eps: AdamW's epsilon (> 0).
        schedule: "cosine", "inverse_sqrt", "linear" or "constant", after ``warmup_steps``.
        warmup_steps: optimizer steps of linear warm-up from ~0 to ``lr`` (>= 0).
        min_lr_ratio: floor of cosine/linear decay, as a fraction of ``lr``, in [0, 1].
        grad_clip: max global gradient norm, > 0 (None: no clipping).
        grad_accum: micro-batches per optimizer step (>= 1).
        precision: "auto" (bf16 where the device computes it natively, else fp32: see
            :mod:`~scratchformer.training.precision`), "fp32", "bf16" (autocast; CPU or GPU),
            "fp16" (autocast + GradScaler; GPU) or "fp64" (weights and arithmetic in float64: for
            tests, the same numbers on any CPU).
        eval_every: evaluate every N steps (0: only at the end); the best checkpoint is kept.
        best_metric: which evaluation metric picks the best checkpoint (one the task reports).
        best_mode: "max" (higher ``best_metric`` is better) or "min".
        patience: stop early after N evaluations in a row that do not improve ``best_metric``
            (0: never; needs ``eval_every``). A resumed run may change it.
        save_every: write the resumable ``last/`` checkpoint every N steps (0: only at the end).
        keep_checkpoints: also keep the last N evaluated weights as ``step-NNNNNNN/`` (for
            checkpoint averaging; 0: none).
        log_every: steps between log lines (>= 1).
        tensorboard: also write the log lines as TensorBoard event files into ``out_dir/tensorboard/``
            (needs ``pip install -e ".[tensorboard]"``).
        seed: everything random derives from it.
        device: "auto" (CUDA if available, else Apple's MPS, else the CPU), "cpu", "cuda", "cuda:1",
            "mps"; one this machine lacks is refused before any work (under torchrun: "auto",
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
    lr_groups: dict[str, float] = field(default_factory=dict)
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
    patience: int = 0
    save_every: int = 0
    keep_checkpoints: int = 0
    log_every: int = 10
    tensorboard: bool = False
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
        if isinstance(self.out_dir, str) and not self.out_dir.strip():  # "" would be the working folder
            raise ValueError(f"out_dir must name a folder (e.g. runs/imdb), got {self.out_dir!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode: expected 'min' or 'max', got {self.best_mode!r}")
        self._check_types()
        self._check_ranges()

    def _check_types(self) -> None:
        """Counts are integers >= their least value; every field has its annotated type (a JSON
        recipe may hold "lr": "1e-3"); numpy's numbers become Python's (JSON needs ours)."""
        for name, least in AT_LEAST.items():  # epochs=1.5 would never reach its last step (nor save it)
            value = getattr(self, name)
            if not (name == "max_steps" and value is None) and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least
            ):
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        for name, hint in typing.get_type_hints(TrainConfig).items():
            value = getattr(self, name)
            if not _fits(value, hint):
                raise ValueError(f"{name} must be {_describe(hint)}, got {value!r}")
            if isinstance(value, numbers.Number) and not isinstance(value, (bool, int, float)):
                setattr(self, name, int(value) if isinstance(value, numbers.Integral) else float(value))

    def _check_ranges(self) -> None:
        """The numbers that would train silently wrong: a zero learning rate, betas of 1, NaN or
        infinity in any number (named: "lr must be a finite number, got nan"), ..."""
        for name in typing.get_type_hints(TrainConfig):
            value = getattr(self, name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, float) and not math.isfinite(item):
                    raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be positive, got {self.lr}")
        for prefix, lr in self.lr_groups.items():
            if not prefix or not lr > 0 or not math.isfinite(lr):
                raise ValueError(
                    f"lr_groups: expected {{parameter name prefix: lr > 0}}, got {prefix!r}: {lr}"
                )
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive (or null: no clipping), got {self.grad_clip}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not self.weight_decay >= 0 or not self.adam_eps > 0:
            raise ValueError(
                f"weight_decay must be >= 0 and adam_eps > 0, got {self.weight_decay}, {self.adam_eps}"
            )
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.patience and not self.eval_every:
            raise ValueError(
                f"patience={self.patience} counts evaluations: it needs eval_every > 0 "
                "(eval_every=0 evaluates only at the end)"
            )


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint``: an integer is a float, a bool is no number,
    a path is a string."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in args)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and len(value) == len(args) and all(map(_fits, value, args))
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items()
        )
    if isinstance(value, bool):
        return hint is bool
    return isinstance(
        value, {int: numbers.Integral, float: numbers.Real, str: (str, os.PathLike)}.get(hint, hint)
    )


def _describe(hint: Any) -> str:
    """``hint`` in words: "an integer or null", "[a number, a number]"."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, args))
    if typing.get_origin(hint) is tuple:
        return f"[{', '.join(map(_describe, args))}]"
    if typing.get_origin(hint) is dict:
        return f"{{{_describe(args[0])}: {_describe(args[1])}, ...}}"
    return TYPE_NAMES[hint]
