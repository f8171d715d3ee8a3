"""What every Hugging Face checkpoint directory needs, in and out: ``config.json``, weights from
``model.safetensors`` only (pickle files are refused, never unpickled), a report of every tensor
that does not fit, and an export directory written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from scratchformer.files.locks import widen_to_umask

__all__ = [
    "CLASSIFIER_EXPORT_HEAD",
    "CLASSIFIER_EXPORT_KEY",
    "CheckpointError",
    "remove_stale_temporaries",
    "check_new_directory",
    "fit_state",
    "model_type",
    "read_json",
    "read_weights",
    "require_file",
    "split_qkv",
    "write_directory",
    "write_export",
]


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: lists every missing, unexpected or mis-shaped tensor."""


def read_json(path: Path, expected: type = dict) -> Any:
    """A JSON file holding an object (or a list, ``expected=list``); anything else is a CheckpointError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, expected):
        raise CheckpointError(
            f"{path}: expected a JSON {'object' if expected is dict else 'list'}, got {type(data).__name__}"
        )
    return data


def model_type(directory: str | Path) -> str | None:
    """The ``model_type`` of a Hugging Face directory's config.json; None if there is none (or it is
    not a readable JSON object: then the directory is left to the loader that reports the problem)."""
    try:
        return read_json(Path(directory) / "config.json").get("model_type")
    except (OSError, CheckpointError):
        return None


# The config.json key of a classifier export holding what BERT's config cannot: the labels, the
# pooling, the tokenizer settings and the file of the class head (see LoadedClassifier.save_pretrained).
CLASSIFIER_EXPORT_KEY = "scratchformer_classifier"
CLASSIFIER_EXPORT_HEAD = "classifier_head.safetensors"


def split_qkv(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our stacked ``qkv_proj`` [W^Q; W^K; W^V] -> separate ``q_proj``, ``k_proj``, ``v_proj`` (as
    the Hugging Face formats store them); other tensors as they are."""
    out = {}
    for name, tensor in state.items():
        if ".qkv_proj." in name:
            for x, part in zip("qkv", tensor.chunk(3)):
                out[name.replace(".qkv_proj.", f".{x}_proj.")] = part.clone()
        else:
            out[name] = tensor
    return out


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def read_weights(directory: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config.json, the tensors of model.safetensors) of a checkpoint directory; ``*.bin`` files
    are pickles and are refused."""
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {directory}")
    config = read_json(require_file(directory / "config.json", "config.json"))
    weights = directory / "model.safetensors"
    if not weights.is_file():
        pickled = [p.name for p in directory.glob("*.bin")]
        hint = (
            f" (found {pickled}: pickle files are not loaded; convert them to safetensors)" if pickled else ""
        )
        raise FileNotFoundError(f"model.safetensors not found in {directory}{hint}")
    return config, load_file(str(weights))


def fit_state(
    build: Callable[[], nn.Module], state: dict[str, Tensor], unexpected: list[str], source: Path
) -> nn.Module:
    """``build()`` the model config.json describes and load ``state`` (our names) into it as float32,
    or raise one error listing every missing, unexpected (``unexpected``: source names no rule
    mapped) and mis-shaped tensor. The model is first built on the meta device (no memory): a
    config.json edited to a huge model (``d_model`` 10^6) is refused before anything is allocated."""
    with torch.device("meta"):
        expected = build().state_dict()
    missing = sorted(set(expected) - set(state))
    misshaped = [
        f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    unexpected = unexpected + sorted(k for k in state if k not in expected)
    if missing or unexpected or misshaped:
        problems = [f"missing: {_first(missing)}"] if missing else []
        problems += [f"unexpected: {_first(unexpected)}"] if unexpected else []
        problems += [f"mis-shaped: {_first(misshaped)}"] if misshaped else []
        raise CheckpointError(f"{source} does not fit the model from config.json; " + "; ".join(problems))
    model = build()
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model


def _first(items: list[str], n: int = 5) -> str:
    """The first ``n`` of ``items``, and how many more (an error stays one readable line)."""
    more = f", ... {len(items) - n} more" if len(items) > n else ""
    return "[" + ", ".join(map(repr, items[:n])) + more + "]"


def check_new_directory(directory: str | Path) -> Path:
    """An export target: a path that does not exist yet, or an empty directory."""
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"{directory} already exists and is not empty; choose another output directory")
    return directory


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the ``.NAME.tmp-*`` folders an export to ``directory`` killed before its rename left
    beside it (only those of this name: another export's temporaries are not ours). Returns them."""
    if not directory.parent.is_dir():
        return []
    stale = [p for p in directory.parent.glob(f".{directory.name}.tmp-*") if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def write_export(
    directory: str | Path,
    config: dict[str, Any],
    state: dict[str, Tensor],
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write config.json + model.safetensors (+ ``extra_files(tmp)``) into a new ``directory``,
    atomically (a temporary sibling renamed into place; those an earlier, killed export to the same
    name left behind are removed first). An existing non-empty directory is an error."""

    def fill(tmp: Path) -> None:
        tensors = {k: v.detach().clone().contiguous() for k, v in state.items()}  # tied names: one copy each
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if extra_files is not None:
            extra_files(tmp)

    return write_directory(directory, fill)


def write_directory(directory: str | Path, fill: Callable[[Path], None]) -> Path:
    """Run ``fill(tmp)`` on a temporary sibling of the new ``directory``, then rename it into place:
    a killed export leaves no half directory (and the temporaries an earlier, killed export to the
    same name left behind are removed first). An existing non-empty directory is an error."""
    directory = check_new_directory(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        fill(tmp)
        widen_to_umask(tmp)  # mkdtemp's 0700 and safetensors' 0600 would keep the export private
        if directory.exists():
            directory.rmdir()
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
