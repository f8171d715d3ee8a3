"""Checkpoints: a directory, written atomically, loaded without unpickling arbitrary objects::

    model.safetensors   weights (safetensors; shared/tied tensors stored once)
    config.json         everything needed to rebuild the model (and its task settings)
    tokenizer.json      the tokenizer, when there is one
    training_state.pt   optimizer, scheduler, step, RNG states: plain tensors and containers,
                        read back with ``torch.load(weights_only=True)``

Atomic: the new checkpoint is written completely into a temporary sibling directory, then swapped
in by renames. A crash at any moment leaves either the previous or the new checkpoint complete:
if it happens between the two renames, the previous one is found under ``NAME.old`` (and the next
save moves it back before anything is deleted). Temporaries of an interrupted save are removed by
the next save.

Checked on load: ``config.json`` records the SHA-256 of ``model.safetensors``, verified before the
weights are used (flipped bytes are an error, not values of 1e36); :func:`load_checked` compares
the model a config describes with the tensor shapes in the file before allocating any memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_model
from torch import Tensor, nn

from scratchformer.files.locks import widen_to_umask

__all__ = [
    "average_checkpoints",
    "check_training_state",
    "foreign_checkpoint",
    "finish_interrupted_save",
    "load_checked",
    "load_config",
    "load_training_state",
    "load_weights",
    "open_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "update_config",
    "verified_weights",
    "write_text_atomically",
]

WEIGHTS, CONFIG, TOKENIZER, STATE = "model.safetensors", "config.json", "tokenizer.json", "training_state.pt"


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    config: dict[str, Any],
    training_state: dict[str, Any] | None = None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint directory atomically. ``extra_files(tmp_dir)`` may add files (a tokenizer)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    old = directory.with_name(directory.name + ".old")
    if (
        old.exists() and not (directory / CONFIG).is_file()
    ):  # an earlier swap was interrupted: old is the checkpoint
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(old, directory)
    _remove_temporaries(directory)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        save_model(model, str(tmp / WEIGHTS))
        (tmp / CONFIG).write_text(json.dumps({**config, "weights_sha256": _sha256(tmp / WEIGHTS)}, indent=2))
        if training_state is not None:
            torch.save(training_state, tmp / STATE)
        if extra_files is not None:
            extra_files(tmp)
        _fsync_dir_files(tmp)
        widen_to_umask(tmp)  # mkdtemp's 0700 and safetensors' 0600 would keep the checkpoint private
        if old.exists():
            shutil.rmtree(old)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def finish_interrupted_save(directory: str | Path) -> None:
    """Complete the clean-up of a save killed after its swap: with ``directory`` whole, remove a left
    ``NAME.old`` and temporaries (otherwise the next save does; a resumed run may not save again)."""
    directory = Path(directory)
    if not (directory / CONFIG).is_file():
        return
    shutil.rmtree(directory.with_name(directory.name + ".old"), ignore_errors=True)
    _remove_temporaries(directory)


def _remove_temporaries(directory: Path) -> None:
    """The temporary directories an interrupted save of ``directory`` left beside it."""
    for stale in directory.parent.glob(f".{directory.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _fsync_dir_files(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            _fsync(path)


def _fsync(path: Path) -> None:
    """Flush ``path``'s data to the disk (before a rename makes it the real file)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def resolve_checkpoint(directory: str | Path) -> Path:
    """The checkpoint directory to read: ``directory``, or ``directory.old`` after an interrupted swap."""
    directory = Path(directory)
    if (directory / CONFIG).is_file():
        return directory
    old = directory.with_name(directory.name + ".old")
    if (old / CONFIG).is_file():
        return old
    raise FileNotFoundError(f"no checkpoint at {directory} (expected {CONFIG} and {WEIGHTS} there)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_config(directory: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint (a JSON object; anything else is an error naming the file)."""
    path = resolve_checkpoint(directory) / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def update_config(directory: str | Path, **fields: Any) -> None:
    """Set ``fields`` in a checkpoint's config.json (the weights and their checksum are untouched),
    atomically: the new file is written beside it and renamed over it."""
    path = resolve_checkpoint(directory) / CONFIG
    write_text_atomically(path, json.dumps({**load_config(directory), **fields}, indent=2))


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``.NAME.tmp`` beside ``path``, flush it to disk, and rename it over ``path``:
    a crash leaves the old file or the new one, never a part of either."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, path)


def verified_weights(directory: str | Path) -> Path:
    """The checkpoint's ``model.safetensors``, after checking it against the SHA-256 in its
    config.json (checkpoints written before the checksum existed are read unchecked)."""
    directory = resolve_checkpoint(directory)
    path, expected = directory / WEIGHTS, load_config(directory).get("weights_sha256")
    if not path.is_file():
        raise FileNotFoundError(f"no {WEIGHTS} in {directory}")
    if expected is not None and _sha256(path) != expected:
        raise ValueError(
            f"{path} is damaged: its SHA-256 differs from the one recorded in {CONFIG} when it was saved"
        )
    return path


def load_checked(directory: str | Path, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` the model a checkpoint's config describes and load its weights (verified once).
    The model is first built on the meta device (no memory) and compared with the shapes in
    ``model.safetensors``: a config that does not fit its weights is an error before anything
    large is allocated."""
    path = verified_weights(directory)
    with torch.device("meta"):
        skeleton = build()
    _check_memory(skeleton, path.parent)
    with safe_open(str(path), framework="pt") as f:
        shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}
    aliases: dict[int, set[str]] = {}  # tied tensors are stored once, under one of their names
    for name, tensor in skeleton.state_dict(keep_vars=True).items():
        aliases.setdefault(id(tensor), set()).add(name)
    try:
        missing, unexpected = skeleton.load_state_dict(
            {k: torch.empty(s, device="meta") for k, s in shapes.items()}, strict=False, assign=True
        )
    except RuntimeError as e:
        raise ValueError(
            f"{directory}: config.json does not fit model.safetensors: "
            + "; ".join(line.strip() for line in str(e).splitlines()[1:] if line.strip())
        ) from None
    group = {name: names for names in aliases.values() for name in names}
    loaded = set(group) - set(missing)
    missing = [
        n for n in missing if not group.get(n, {n}) & loaded
    ]  # a tied alias of a loaded tensor is fine
    if missing or unexpected:
        raise ValueError(
            f"{directory}: config.json does not fit model.safetensors: missing {sorted(missing)[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {sorted(unexpected)[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}"
        )
    model = build()
    _load_verified(model, path)
    return model


def _check_memory(skeleton: nn.Module, directory: Path) -> None:
    """Refuse, before anything is allocated, a model (built on the meta device) whose parameters and
    buffers would not fit this machine's memory, where it is built: a config.json edited to a huge
    model is named, not left to swap or to be killed."""
    from scratchformer.training.run_checks import available_memory  # (run_checks imports this module)

    tensors = {id(t): t for t in (*skeleton.parameters(), *skeleton.buffers())}.values()
    needed = sum(t.numel() * t.element_size() for t in tensors)
    have = available_memory(torch.device("cpu"))
    if have and needed > have:
        parameters = sum(p.numel() for p in {id(p): p for p in skeleton.parameters()}.values())
        raise ValueError(
            f"{directory / CONFIG} describes a model of {parameters:,} parameters that needs about "
            f"{needed / 2**30:,.1f} GiB, but this machine's memory is {have / 2**30:,.1f} GiB: "
            "it cannot be loaded here (is config.json edited to a larger model than its weights?)"
        )


def open_checkpoint(directory: str | Path, kind: str) -> tuple[Path, dict[str, Any]]:
    """(the directory to read, its config.json), checking that it holds a ``kind`` checkpoint."""
    directory = resolve_checkpoint(directory)
    config = load_config(directory)
    if config.get("kind") != kind:
        raise ValueError(foreign_checkpoint(directory, config, kind))
    return directory, config


def foreign_checkpoint(directory: str | Path, config: dict[str, Any], wanted: str) -> str:
    """The message for a config.json that is not a ``wanted`` scratchformer checkpoint: it names
    what the directory holds instead (another kind, a Hugging Face export, or neither)."""
    kind, found = config.get("kind"), config.get("model_type")
    if kind is not None:
        return f"{directory} holds a {kind!r} checkpoint, not a {wanted} checkpoint"
    accepts = (
        f"a scratchformer {wanted} checkpoint (a run's best/ or last/ folder, config.json with a 'kind')"
    )
    if isinstance(found, str):
        return (
            f"{directory} is a Hugging Face {found.upper() if found == 'bert' else found} export "
            f"(config.json model_type {found!r}), not {accepts}"
        )
    return f"{directory}: config.json records no 'kind' (nor a Hugging Face 'model_type'); expected {accepts}"


def load_weights(model: nn.Module, directory: str | Path) -> None:
    """Load ``model.safetensors`` into ``model``; a missing or unexpected tensor is an error."""
    _load_verified(model, verified_weights(directory))


def _load_verified(model: nn.Module, path: Path) -> None:
    missing, unexpected = load_model(model, str(path), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def load_training_state(directory: str | Path, map_location: str | None = "cpu") -> dict[str, Any]:
    """The optimizer/scheduler/step/RNG state, read with ``weights_only=True`` (no arbitrary unpickling)
    into CPU memory (a GPU-saved state loads on a machine without one; the optimizer moves its
    state to the parameters' device); ``map_location=None`` keeps the saved devices."""
    path = resolve_checkpoint(directory) / STATE
    if not path.is_file():
        raise FileNotFoundError(f"no training state in {path.parent} (was it saved for resuming?)")
    return _read_state(path, map_location)


# What a resumed run restores from a training state (see training/state.py: restore)
STATE_KEYS = ("optimizer", "scheduler", "step", "epoch", "next_group", "best", "rng")


def check_training_state(directory: str | Path) -> None:
    """Refuse, before any work, a training state a run cannot resume from: not the zip archive
    ``torch.save`` writes (truncated, or another file), unreadable, or not a dictionary with every
    entry a resumed run restores; the error names the file and what is wrong. The tensors are
    memory-mapped, not read."""
    path = resolve_checkpoint(directory) / STATE
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is damaged: not the zip archive torch.save writes (truncated, or another file); "
            "--resume cannot continue from it"
        )
    state = _read_state(path, "cpu", mmap=True)
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(
            f"{path} is not a training state: it lacks {missing}; --resume cannot continue from it"
        )


def _read_state(path: Path, map_location: str | None, mmap: bool = False) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; what it cannot read, or anything but a dictionary, is
    a ValueError naming the file and the reason (torch's first line)."""
    try:
        state = torch.load(path, weights_only=True, map_location=map_location, mmap=mmap)
    except OSError:
        raise
    except Exception as e:  # zip, unpickler and weights-only errors (RuntimeError, UnpicklingError, EOFError)
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(
            f"{path} is damaged or not a training state ({reason[:200]}); --resume cannot continue from it"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(
            f"{path} is not a training state: it holds a {type(state).__name__}, not a dictionary; "
            "--resume cannot continue from it"
        )
    return state


def average_checkpoints(directories: Sequence[Path], model: nn.Module) -> None:
    """Load into ``model`` the element-wise mean of the weights in ``directories`` (accumulated in
    float64). Averaging the last checkpoints of a run smooths the noise of the final steps."""
    total: dict[str, Tensor] = {}
    for directory in directories:
        for name, tensor in load_file(str(verified_weights(directory))).items():
            total[name] = total.get(name, 0) + tensor.double()  # type: ignore[operator]
    missing, unexpected = model.load_state_dict(
        {k: (v / len(directories)).float() for k, v in total.items()}, strict=False
    )
    params = model.state_dict(keep_vars=True)
    loaded = {params[k].data_ptr() for k in total if k in params}
    missing = [k for k in missing if params[k].data_ptr() not in loaded]  # tied tensors are stored once
    if missing or unexpected:
        raise ValueError(
            f"checkpoint average does not fit the model: missing {missing}, unexpected {unexpected}"
        )
