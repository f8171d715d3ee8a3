"""What one call of :meth:`Trainer.fit` works with (:class:`Run`), and the part of it that
``last/training_state.pt`` saves and a resumed run restores."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from scratchformer.training import distributed

__all__ = ["Run", "restore", "training_state"]


@dataclass
class Run:
    """The optimisation, where the loop is, and what this call has seen so far.

    Where the loop is: ``step`` optimizer steps done; the next one uses accumulation group
    ``next_group`` of epoch ``epoch`` (``groups``: that epoch's groups of ``grad_accum``
    micro-batches, None until they are drawn).
    """

    train_model: nn.Module  # what the steps call: the model, or DistributedDataParallel(model) under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler  # fp16's; disabled (a plain step) otherwise
    total: int  # optimizer steps of the whole run
    shards: dict[int, list[Any]]  # without max_steps: every epoch's micro-batches, made once (they set total)
    step: int = 0
    epoch: int = 0
    next_group: int = 0
    groups: list[list[Any]] | None = None
    best: dict[str, float] | None = None  # the best evaluation so far, with its "step"
    skipped: int = 0  # fp16: optimizer steps the GradScaler skipped, in the whole run
    consecutive_skips: int = 0
    evals_without_improvement: int = 0  # evaluations in a row that did not beat ``best`` (for patience)
    stopped_early: dict[str, Any] | None = None  # {"step", "best_step", "patience"} once patience ran out
    lr: float = 0.0  # the learning rate the last optimizer step used
    losses: list[float] = field(default_factory=list)  # one per optimizer step of this call
    evals: list[dict[str, float]] = field(default_factory=list)  # this call's evaluations, with their "step"
    window_items: float = 0.0  # items (tokens) of all ranks since the last log line
    window_start: float = field(default_factory=time.perf_counter)
    start: float = field(default_factory=time.perf_counter)
    bar: tqdm | None = None  # the progress bar (shown on rank 0 only), made when the loop starts

    def due(self, every: int) -> bool:
        """Whether the step just done is a multiple of ``every`` (0: none is) or the run's last."""
        return (every > 0 and self.step % every == 0) or self.step == self.total


def training_state(run: Run, world: distributed.World, device: torch.device) -> dict[str, Any]:
    """The resumable state; a collective under torchrun (every rank's RNG state is gathered)."""
    rng = _rng_state(device)
    state = {
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "step": run.step,
        "epoch": run.epoch,
        "next_group": run.next_group,
        "best": run.best,
        "skipped_steps": run.skipped,
        "evals_without_improvement": run.evals_without_improvement,
        "stopped_early": run.stopped_early,
        "rng": rng,
        "world_size": world.size,
    }
    if world.distributed:
        state["rng_ranks"] = distributed.all_gather_object(rng)
    return state


def restore(run: Run, state: dict[str, Any], device: torch.device, where: str) -> None:
    """Continue ``run`` from a saved training state (``state["rng"]``: this rank's), read from ``where``."""
    saved = [len(g["params"]) for g in state["optimizer"]["param_groups"]]
    if saved != [len(g["params"]) for g in run.optimizer.param_groups]:
        raise ValueError(
            f"{where}: its optimizer state holds {saved} parameter tensors per group, "
            f"this model has {[len(g['params']) for g in run.optimizer.param_groups]} (saved by another "
            "model or release); its weights load, but the run cannot resume"
        )
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if run.scaler.is_enabled() and state.get("scaler"):  # (a bf16/fp32 run saved an empty scaler state)
        run.scaler.load_state_dict(state["scaler"])
    run.step, run.epoch, run.next_group, run.best = (
        state["step"],
        state["epoch"],
        state["next_group"],
        state["best"],
    )
    run.skipped = state.get("skipped_steps", 0)  # (older states lack the newer counters)
    run.evals_without_improvement = state.get("evals_without_improvement", 0)
    run.stopped_early = state.get("stopped_early")
    _set_rng_state(state["rng"], device)


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
