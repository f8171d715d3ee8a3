"""What a run needs before any work starts: its device, its packages, an output directory fit for a
fresh run or a resumption, writable and in use by no other run (locked), memory for its model, and
(when resuming) a checkpoint saved by the same run."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scratchformer.files import locks
from scratchformer.training import distributed
from scratchformer.training.checkpoint import check_training_state, load_config
from scratchformer.training.config import RESUME_FIXED, TrainConfig

__all__ = [
    "LOCK",
    "RUN_OUTPUTS",
    "available_memory",
    "check_memory",
    "check_run",
    "count_parameters",
    "check_same_run",
    "earlier_run",
    "holds_a_run",
    "release_run",
    "remove_earlier_run",
    "resolve_device",
    "training_bytes",
]

LOCK = ".lock"  # in out_dir while a run uses it: {"pid", "host", "started"} (see files/locks.py)

RUN_OUTPUTS = (
    "last",
    "last.old",
    "best",
    "best.old",
    "averaged",
    "metrics.jsonl",
    "tensorboard",
    "report.json",
    "curves.png",
    "encoder",
)


def earlier_run(out_dir: str | Path) -> list[str]:
    """What an earlier run left in ``out_dir`` (checkpoints, logs, report, test outputs)."""
    out = Path(out_dir)
    return (
        sorted(
            p.name
            for p in out.glob("*")
            if p.name in RUN_OUTPUTS
            or p.name.startswith("step-")
            or p.name.endswith(("_hypotheses.txt", "_captions.txt"))
        )
        if out.is_dir()
        else []
    )


def remove_earlier_run(out_dir: str | Path) -> None:
    """Delete what :func:`earlier_run` finds (``overwrite``, once the new run starts)."""
    for name in earlier_run(out_dir):
        path = Path(out_dir) / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def check_run(config: TrainConfig, resume: bool) -> None:
    """What a run needs before any work starts (the tasks call this first; so does the Trainer):
    the device exists, the precision suits it, TensorBoard is installed if the recipe asks for it,
    and ``out_dir`` is a writable directory (or can be made one), used by no other run, and fit for a
    fresh run (no earlier run there, unless ``overwrite``: the Trainer removes it when training
    starts) or for ``resume``. It takes ``out_dir``'s lock (``out_dir/.lock``; see
    :mod:`~scratchformer.files.locks`) for this process: :func:`release_run` gives it back (the
    Trainer does at the end of ``fit`` when it took it; a process exit always does). The output
    directory is rank 0's (other machines need no copy): rank 0 checks and locks it, every rank gets
    its verdict."""
    device = resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise ValueError("precision 'fp16' needs a CUDA device (GradScaler); use 'bf16' on CPU")
    if config.tensorboard:
        require_tensorboard()
    distributed.on_main(lambda: _check_and_lock(Path(config.out_dir), resume, config.overwrite))


def release_run(out_dir: str | Path) -> None:
    """Give back ``out_dir``'s lock, if this process holds it (see :func:`check_run`)."""
    locks.release(Path(out_dir) / LOCK)


def _check_and_lock(out: Path, resume: bool, overwrite: bool) -> None:
    _check_writable(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    taken = locks.acquire(out / LOCK, f"output directory {out}")
    try:
        _check_out_dir(out, resume, overwrite)
    except BaseException:
        if taken:
            locks.release(out / LOCK)
        if made and not any(out.iterdir()):
            out.rmdir()  # a refused run leaves no folder behind
        raise


def _check_writable(out: Path) -> None:
    """``out`` is a directory this process may write into, or one it can create."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output directory {out} is a file, not a directory")
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"output directory {out}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"output directory {out}: {existing} is not writable")


def require_tensorboard() -> None:
    """Fail at once, naming the package, when ``tensorboard: true`` cannot be honoured."""
    try:
        importlib.import_module("torch.utils.tensorboard")  # (it imports the tensorboard package)
    except ImportError as e:
        raise ImportError(
            '"tensorboard": true needs the tensorboard package: pip install -e ".[tensorboard]"'
        ) from e


def _check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    if resume:
        if (
            not (out / "last" / "training_state.pt").is_file()
            and not (out / "last.old" / "training_state.pt").is_file()
        ):
            raise FileNotFoundError(f"--resume: no resumable checkpoint in {out} (expected {out / 'last'})")
        check_training_state(out / "last")  # a damaged one is refused now, not once the data is read
    elif earlier_run(out) and not overwrite:
        raise FileExistsError(
            f"{out} holds an earlier run ({', '.join(earlier_run(out))}): resume it (--resume), "
            "replace it (--overwrite / overwrite=True) or choose another output directory"
        )
    elif earlier_run(out) and not holds_a_run(out):
        raise FileExistsError(
            f"--overwrite would delete {', '.join(earlier_run(out))} in {out}, which holds no run of "
            "scratchformer (no checkpoint folder with a run's config.json, no run's recipe.json): only "
            "what a run wrote is replaced; move those files away or choose another output directory"
        )


def holds_a_run(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds what a run of ours wrote, so that ``overwrite`` may delete its
    outputs: a checkpoint folder (``last/``, ``best/``, ...) whose config.json records its
    ``training`` settings, or the ``recipe.json`` a task's run writes (with ``train.out_dir``). A
    user's own ``report.json`` or ``metrics.jsonl`` in a folder without either is never deleted.
    A phase of a run in a subfolder of it (captioning's ``scst/``) is the run's too."""
    out = Path(out_dir)
    for name in earlier_run(out):
        config = _json(out / name / "config.json")  # (None for a file, e.g. report.json)
        if isinstance(config, dict) and isinstance(config.get("training"), dict):
            return True
    return any(_is_a_runs_recipe(_json(folder / "recipe.json")) for folder in (out, out.absolute().parent))


def _is_a_runs_recipe(recipe: Any) -> bool:
    return isinstance(recipe, dict) and isinstance(recipe.get("train"), dict) and "out_dir" in recipe["train"]


def _json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def count_parameters(build: Callable[[], nn.Module]) -> int:
    """The parameters of the model ``build()`` makes (shared ones once), built on the meta device: no
    memory, milliseconds even for a model of 10^12 parameters (the process's first meta operation
    imports a part of torch once: seconds)."""
    with torch.device("meta"):
        model = build()
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def training_bytes(parameters: int, activation_bytes: int = 0) -> int:
    """The memory of training ``parameters`` float32 parameters with AdamW: 16 bytes each (weights,
    gradients, the two moments), plus the caller's ``activation_bytes`` (its estimate of a batch's
    activations). A lower bound."""
    return 16 * parameters + activation_bytes


def available_memory(device: torch.device) -> int:
    """The memory of ``device`` in bytes: the GPU's (CUDA), else the machine's physical memory
    (CPU and Apple's MPS, which shares it); 0 where unknown (no check then)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 0


def check_memory(needed: int, what: str, device: torch.device) -> None:
    """Refuse, before any work, a run that needs more than ``device`` has: ``needed`` bytes for
    ``what`` (e.g. "a model of 4.1e9 parameters, with AdamW")."""
    have = available_memory(device)
    if have and needed > have:
        raise ValueError(
            f"{what} needs about {needed / 2**30:,.1f} GiB, but {device.type} memory is "
            f"{have / 2**30:,.1f} GiB: make the model smaller"
        )


def resolve_device(name: str) -> torch.device:
    """The device ``name`` means for this process (under torchrun: its own GPU, cuda:LOCAL_RANK)."""
    here = distributed.world()
    return distributed.device_for(name, here.local_rank, here.distributed)


def check_same_run(last: Path, config: TrainConfig, task_config: dict[str, Any]) -> None:
    """Refuse to resume ``last`` with another task or model configuration (``task_config``, the
    task's ``checkpoint_config()``), or other values of the training fields in RESUME_FIXED (only
    those the saved file holds: older ones resume)."""
    saved = load_config(last)
    saved_training = saved.pop("training", {})
    saved.pop("weights_sha256", None)
    training = json.loads(json.dumps(asdict(config)))
    now = {**_leaves(json.loads(json.dumps(task_config))), **{k: training[k] for k in RESUME_FIXED}}
    was = {**_leaves(saved), **{k: saved_training[k] for k in RESUME_FIXED if k in saved_training}}
    differ = [k for k in was if k not in now or now[k] != was[k]]
    if differ:

        def show(values: dict[str, Any]) -> str:
            return ", ".join(f"{k}={json.dumps(values[k])}" if k in values else f"no {k}" for k in differ)

        raise ValueError(
            f"{last} was saved with {show(was)}; this run has {show(now)}: --resume continues a run "
            "with its own settings (only its length, device, precision, logging, saving and patience "
            "may change)"
        )


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """A JSON value's leaves by dotted path: {"model": {"num_heads": 2}} -> {"model.num_heads": 2}."""
    if not isinstance(value, dict) or not value:
        return {path: value}
    return {
        k: v
        for key, item in value.items()
        for k, v in _leaves(item, f"{path}.{key}" if path else key).items()
    }
