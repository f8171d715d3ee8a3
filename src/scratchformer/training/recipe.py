"""Recipes: a task's settings as a JSON file, with a ``train`` section for :class:`TrainConfig`;
``--set KEY=VALUE`` (:func:`apply_sets`) changes any field of it, as the file would."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from scratchformer.core.keys import reject_unknown
from scratchformer.training.trainer import TrainConfig

__all__ = ["Recipe", "apply_sets", "load_recipe", "parse_set", "resolve_data_path"]

R = TypeVar("R")


def load_recipe(cls: type[R], path: str | Path | None, sets: Sequence[str] = (), **overrides: Any) -> R:
    """Build the recipe dataclass ``cls`` from JSON (``path``; None: the defaults alone); ``sets``
    (``"train.lr=3e-4"``, see :func:`apply_sets`) change it, then ``overrides`` replace fields and
    ``overrides["train"]`` replaces entries of the ``train`` section. Unknown fields are an error."""
    data: dict[str, Any] = {} if path is None else _read_json(path)
    source = str(path) if path is not None else "recipe"
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a recipe is a JSON object, got {type(data).__name__}")
    reject_unknown(data, [f.name for f in dataclasses.fields(cls)], source)  # type: ignore[arg-type]
    data = apply_sets(cls, data, sets)
    if not isinstance(data.get("train", {}), dict):
        raise ValueError(f"{source}: 'train' must be an object")
    reject_unknown(
        data.get("train", {}), [f.name for f in dataclasses.fields(TrainConfig)], f"{source}: train"
    )
    train = dict(data.pop("train", {}), **overrides.pop("train", {}))
    return cls(**{**data, **overrides}, train=TrainConfig(**train))  # type: ignore[call-arg]


def _read_json(path: str | Path) -> Any:
    """The recipe file's JSON: NaN and Infinity (no JSON; Python's reader takes them: the error names
    the field, "train.lr is NaN") and a key given twice in one object (the last would win, silently)
    are errors."""
    try:
        data = json.loads(
            Path(path).read_text(encoding="utf-8-sig"), parse_constant=float, object_pairs_hook=_no_duplicates
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON recipe ({e})") from None
    except ValueError as e:
        raise ValueError(f"{path}: not a JSON recipe ({e})") from None
    found = _non_finite(data)
    if found is not None:
        raise ValueError(f"{path}: {found[0]}: {found[1]} is not JSON (a number must be finite)")
    return data


def _non_finite(value: Any, at: str = "") -> tuple[str, str] | None:
    """Where the first NaN or infinity in a JSON-like ``value`` is, and how JSON writes it:
    ("train.lr", "NaN"), ("train.betas[1]", "Infinity") (``at``: the path of ``value`` itself); None if
    there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return at, "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{at}[{key}]" if isinstance(key, int) else f"{at}.{key}" if at else key)
        if found is not None:
            return found
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (a number must be finite)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"{twice} given twice in one object")
    return dict(pairs)


def parse_set(text: str) -> tuple[list[str], Any]:
    """``"train.betas=[0.9, 0.98]"`` -> ``(["train", "betas"], [0.9, 0.98])``: the value is JSON where
    it parses as JSON (``3e-4``, ``true``, ``null``, ``[1, 2]``, ``"007"``), else the text itself."""
    key, equals, value = text.partition("=")
    path = key.strip().split(".")
    if not equals or not all(path):
        raise ValueError(f"--set {text}: expected KEY=VALUE with a dotted KEY (e.g. train.lr=3e-4)")
    try:
        return path, json.loads(value, parse_constant=_no_constant)
    except ValueError:  # not JSON (NaN and Infinity neither): the text itself
        return path, value


def apply_sets(cls: type, data: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """``data`` (a recipe's JSON object) with each ``KEY=VALUE`` of ``sets`` set in it, in order: a
    field (``batch_size=16``), an entry of ``train`` (``train.lr=3e-4``) or of a section that is an
    object (``model.dropout=0.2``, ``decoding.beam_size=4``: the recipe's default section when the
    file has none). An unknown field names the closest known ones; the values are checked later, by
    the recipe, as the file's are."""
    data = json.loads(json.dumps(data))  # a deep copy: the caller's dict stays as it was
    defaults = _defaults(cls)
    for text in sets:
        path, value = parse_set(text)
        if path[0] not in defaults and path[0] in defaults.get("train", {}):
            raise ValueError(f"--set {text}: {path[0]} is a field of the train section: train.{text}")
        reject_unknown({path[0]: value}, defaults, f"--set {text}")
        if len(path) == 1:
            data[path[0]] = value
            continue
        section = data.get(path[0], {} if path[0] == "train" else defaults[path[0]])
        if not isinstance(section, dict):
            raise ValueError(
                f"--set {text}: {path[0]} is not a section (an object); set it whole: {path[0]}=VALUE"
            )
        data[path[0]] = section = dict(section)
        if path[0] == "train":
            reject_unknown({path[1]: value}, defaults["train"], f"--set {text}: train")
        for depth, name in enumerate(path[1:-1], start=1):
            inner = section.get(name, {})
            if not isinstance(inner, dict) or path[0] == "train":
                raise ValueError(f"--set {text}: {'.'.join(path[: depth + 1])} is not a section")
            section[name] = section = dict(inner)
        section[path[-1]] = value
    return data


def _defaults(cls: type) -> dict[str, Any]:
    """The recipe's fields and their defaults as JSON would hold them (a required field: None)."""
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None if f.default is dataclasses.MISSING else f.default
        defaults[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return defaults


class Recipe:
    """Base of the task recipes (dataclasses with a ``train: TrainConfig`` field)."""

    train: TrainConfig

    METRICS: tuple[str, ...] = ("loss",)  # what the task's evaluation reports (best_metric is one)

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            self.train = TrainConfig(**self.train)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            found = None if f.name == "train" else _non_finite(getattr(self, f.name), f.name)
            if found is not None:  # (the train section checks its own numbers)
                raise ValueError(f"{found[0]} must be a finite number, got {found[1]}")
        if self.train.best_metric not in self.METRICS:
            raise ValueError(
                f"train.best_metric: expected one of {self.METRICS}, got {self.train.best_metric!r}"
            )
        try:
            self.validate()  # its messages are the more precise ones ("at least two distinct names")
        except (TypeError, AttributeError):  # a field of the wrong type ("model": null) hit an operation
            self._check_types()
            raise
        self._check_types()  # what validate does not check: "text_field": 3, "lowercase": 1

    def _check_types(self) -> None:
        """Every field but ``train`` has its annotated type, as JSON writes it (a recipe may hold
        "text_field": 3, "lowercase": 1 or "model": null); the ranges are ``validate``'s."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name != "train" and not _fits(value, hints[f.name]):
                raise ValueError(f"{f.name} must be {_describe(hints[f.name])}, got {value!r}")

    def validate(self) -> None:
        """The task's own checks, run on construction, before any data is read (override)."""

    @classmethod
    def from_json(cls: type[R], path: str | Path, sets: Sequence[str] = (), **overrides: Any) -> R:
        return load_recipe(cls, path, sets, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint``: an integer is a float, a bool is no number,
    a path is a string, a list or dict has items of its types."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and _fits(v, args[1]) for k, v in value.items()
        )
    if isinstance(value, bool):
        return hint is bool
    return isinstance(
        value, {int: numbers.Integral, float: numbers.Real, str: (str, os.PathLike)}.get(hint, hint)
    )


def _describe(hint: Any) -> str:
    """``hint`` in words: "a string or null", "a list of strings", "an object"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, args))
    if origin is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s"
    if origin is dict:
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, "null" if hint is type(None) else getattr(hint, "__name__", str(hint))
    )


def resolve_data_path(path: str | None, data_dir: str | Path) -> str | None:
    """Replace ``{data}`` in a recipe path with the shared data directory."""
    return None if path is None else path.replace("{data}", str(data_dir))
