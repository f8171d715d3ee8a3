"""Several processes training one model (data parallelism), as ``torchrun`` launches them.

``torchrun --nproc-per-node N`` starts N copies of the same command and tells each one its place
through the environment: ``WORLD_SIZE`` (processes in all), ``RANK`` (this one, 0..N-1),
``LOCAL_RANK`` (its index on this machine: which GPU it owns), ``MASTER_ADDR``/``MASTER_PORT``
(where to meet). :func:`init` joins them into one process group (gloo on CPU, NCCL on GPU); the
trainer then wraps the model in ``DistributedDataParallel``, deals each rank its share of the
batches, and keeps every rank in step with the few collectives below.

Without torchrun (``WORLD_SIZE`` unset or 1) there is one process, no process group, and every
function here is a no-op: single-process training is exactly what it was.

Rank 0 is the *main* process: it alone writes logs, plots and checkpoints, and runs work whose
result every rank needs (:func:`on_main`: evaluation, tokenizer training), broadcasting it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "World",
    "all_gather_object",
    "all_reduce_sum",
    "barrier",
    "destroy",
    "device_for",
    "init",
    "is_main",
    "on_main",
    "shard",
    "world",
    "wrap",
]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 1800.0  # a collective that waits longer than this fails instead of hanging
TIMEOUT_ENV = "SCRATCHFORMER_DIST_TIMEOUT"  # seconds; overrides the default


@dataclass(frozen=True)
class World:
    """Where this process stands: ``rank`` of ``size`` processes, ``local_rank`` on its machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def _env_world() -> World:
    """The world torchrun describes in the environment (one process when it says nothing)."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise ValueError(
            f"inconsistent torchrun environment: WORLD_SIZE={size}, RANK={rank}, LOCAL_RANK={local_rank}"
        )
    return World(rank, size, local_rank)


def world() -> World:
    """This process's place: from the process group if one is running, else from the environment."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()))
    return _env_world()


def is_main() -> bool:
    """True on rank 0 (and in a single process)."""
    return world().is_main


def device_for(name: str, local_rank: int = 0, distributed: bool = False) -> torch.device:
    """The device ``name`` ("auto", "cpu", "cuda", "cuda:1", "mps", ...) means for this process:
    "auto" is CUDA if there is a GPU, else Apple's MPS, else the CPU. A device this machine lacks is
    an error naming it.

    Under torchrun each process owns one GPU, ``cuda:LOCAL_RANK``; naming a GPU index there is an
    error, since every rank would then share that one GPU.
    """
    mps = torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps and not distributed else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r} (expected auto, cpu, cuda, cuda:N or mps)") from None
    if device.type == "mps" and not mps:
        raise ValueError(f"device {name!r} requested, but Apple's MPS is not available on this machine")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested, but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r} requested, but only {torch.cuda.device_count()} GPUs are visible"
            )
        if distributed:
            if device.index is not None:
                raise ValueError(
                    f"device {name!r}: under torchrun each process uses cuda:LOCAL_RANK; "
                    "give 'cuda' or 'auto' (and CUDA_VISIBLE_DEVICES to choose GPUs)"
                )
            if local_rank >= torch.cuda.device_count():
                raise ValueError(
                    f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible"
                )
            device = torch.device("cuda", local_rank)
    return device


def init(device: str = "auto", timeout_s: float | None = None) -> World:
    """Join the process group that torchrun's environment describes, once; return this process's place.

    gloo for a CPU ``device``, NCCL for CUDA (each rank on ``cuda:LOCAL_RANK``). A collective
    waiting longer than ``timeout_s`` (default ``$SCRATCHFORMER_DIST_TIMEOUT`` or 30 min; it must
    exceed rank 0's longest solo work, an evaluation) fails instead of hanging. Calling it again,
    or after the caller made its own process group, changes nothing. One process: returns
    ``World()`` and starts nothing.
    """
    if dist.is_available() and dist.is_initialized():
        return world()
    env = _env_world()
    if not env.distributed:
        return env
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this PyTorch build")
    target = device_for(device, env.local_rank, distributed=True)
    if target.type == "cuda":
        torch.cuda.set_device(target)
    timeout = timeout_s if timeout_s is not None else float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    if timeout <= 0:
        raise ValueError(f"the process-group timeout must be positive, got {timeout} s")
    dist.init_process_group(
        backend="nccl" if target.type == "cuda" else "gloo",
        timeout=timedelta(seconds=timeout),
        device_id=target if target.type == "cuda" else None,
    )
    return world()


def destroy() -> None:
    """Leave the process group (if any); call once at the end of a torchrun job."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank gets here (nothing to wait for in one process)."""
    if world().distributed:
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """The element-wise sum of ``values`` over all ranks (float64), in every rank."""
    if not world().distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, in every rank."""
    if not world().distributed:
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 alone and return its result on every rank (pickled and broadcast).

    If ``fn`` raises on rank 0, every rank raises (rank 0 the original error, the others a
    ``RuntimeError`` quoting it) rather than waiting for a result that never comes. The others
    wait meanwhile, so ``fn`` must finish within the process-group timeout.
    """
    if not world().distributed:
        return fn()
    payload: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            payload[0] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001  (every rank must hear of it; re-raised below)
            error = exc
            payload[0] = ("error", f"{type(exc).__name__}: {exc}")
    dist.broadcast_object_list(payload, src=0)
    status, value = payload[0]
    if error is not None:
        raise error
    if status == "error":
        raise RuntimeError(f"rank 0 failed: {value}")
    return value  # type: ignore[no-any-return]


def shard(batches: list[T], rank: int, size: int) -> list[T]:
    """This rank's share of one epoch's micro-batches, dealt like ``DistributedSampler(drop_last=True)``.

    Rank r takes batches r, r + size, r + 2 size, ...; the last ``len(batches) % size`` batches,
    which cannot be dealt evenly, are left out of this epoch (the next epoch's shuffle leaves out
    others), so that every rank runs the same number of steps and none waits forever. Step k
    with gradient accumulation g then covers global batches ``k g size`` to ``(k + 1) g size - 1``:
    the same data as one process accumulating ``g * size`` micro-batches.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    if len(batches) < size:
        raise ValueError(
            f"{len(batches)} micro-batches cannot be shared by {size} processes (each needs one)"
        )
    return batches[rank : len(batches) - len(batches) % size : size]


def wrap(model: nn.Module, device: torch.device, find_unused_parameters: bool = False) -> nn.Module:
    """The module the training steps call: ``DistributedDataParallel(model)`` under torchrun,
    ``model`` itself in one process.

    DDP copies rank 0's parameters to every rank here. Buffers are not broadcast at every
    forward: our models' buffers are fixed tables (positional encodings), never statistics.
    """
    if not world().distributed:
        return model
    no_buffer_sync: dict[str, Any] = (  # newer PyTorch renamed broadcast_buffers
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters,
        **no_buffer_sync,
    )
