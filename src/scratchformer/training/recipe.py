"""Recipes: a task's settings as a JSON file, with a ``train`` section for :class:`TrainConfig`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from scratchformer.training.trainer import TrainConfig

__all__ = ["Recipe", "load_recipe", "resolve_data_path"]

R = TypeVar("R")


def load_recipe(cls: type[R], path: str | Path, **overrides: Any) -> R:
    """Build the recipe dataclass ``cls`` from JSON; ``overrides`` replace fields, and
    ``overrides["train"]`` replaces entries of the ``train`` section. Unknown fields are an error."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON recipe ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise ValueError(f"{path}: unknown recipe fields {unknown}")
    if not isinstance(data.get("train", {}), dict):
        raise ValueError(f"{path}: 'train' must be an object")
    unknown = sorted(set(data.get("train", {})) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"{path}: unknown fields under 'train': {unknown}")
    train = dict(data.pop("train", {}), **overrides.pop("train", {}))
    return cls(**{**data, **overrides}, train=TrainConfig(**train))  # type: ignore[call-arg]


class Recipe:
    """Base of the task recipes (dataclasses with a ``train: TrainConfig`` field)."""

    train: TrainConfig

    METRICS: tuple[str, ...] = ("loss",)  # what the task's evaluation reports (best_metric is one)

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            self.train = TrainConfig(**self.train)
        if self.train.best_metric not in self.METRICS:
            raise ValueError(
                f"train.best_metric: expected one of {self.METRICS}, got {self.train.best_metric!r}"
            )
        self.validate()

    def validate(self) -> None:
        """The task's own checks, run on construction, before any data is read (override)."""

    @classmethod
    def from_json(cls: type[R], path: str | Path, **overrides: Any) -> R:
        return load_recipe(cls, path, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def resolve_data_path(path: str | None, data_dir: str | Path) -> str | None:
    """Replace ``{data}`` in a recipe path with the shared data directory."""
    return None if path is None else path.replace("{data}", str(data_dir))
