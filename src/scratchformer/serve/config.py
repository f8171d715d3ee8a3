"""What ``scratchformer serve`` runs: the models (a name, a checkpoint directory, a precision), where
it listens, and the limits that keep it answering under any load. A YAML (or JSON) file, or flags.

models:
  - {name: de-en, path: runs/multi30k/best, precision: int8}
  - {name: imdb, path: runs/imdb/best}
port: 8000
batching: continuous
limits: {max_batch_size: 32, max_wait_ms: 5, timeout_s: 30}
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchformer.core.keys import reject_unknown

__all__ = ["Limits", "ModelSpec", "ServeConfig"]

PRECISIONS = ("fp32", "bf16", "int8")
BATCHING = ("continuous", "whole")
A_DAY = 86_400  # the longest any of the server's waits may be, in seconds
MAX_THREADS = 1024


@dataclass
class Limits:
    """Every bound the server enforces, and the micro-batcher's settings (per model)."""

    max_batch_size: int = 32  # inputs decoded together
    max_batch_tokens: int = 4096  # inputs x the longest one's tokens, per batch
    max_wait_ms: float = 5.0  # how long the first queued input waits for others due to join its batch
    max_queue: int = 512  # inputs waiting per model; more: 429 with Retry-After
    max_concurrency: int = 1024  # requests in flight; more: 429 with Retry-After
    max_body_bytes: int = 10_000_000  # a request's body; more: 413
    max_items: int = 64  # inputs in one request; more: 422
    max_input_tokens: int = 512  # tokens of one input; more: 422
    max_new_tokens: int = 256  # a request's max_new_tokens; more: 422
    max_image_pixels: int = 40_000_000  # width x height of an uploaded image; more: 413
    timeout_s: float = 30.0  # from a request's arrival to its answer; later: 504 (its queued work dropped)
    max_head_bytes: int = 65_536  # a request's line and headers; more: 431 and the connection closed
    head_timeout_s: float = 10.0  # for a request's head to arrive whole; later: 408, connection closed
    body_timeout_s: float = 10.0  # the longest pause in a body's arrival; longer: 408, connection closed

    def __post_init__(self) -> None:
        check_types(self, "limits.")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"limits.{f.name} must be a positive number, got {value!r}")
            seconds = value / 1000 if f.name.endswith("_ms") else value
            if f.name.endswith(("_s", "_ms")) and not seconds <= A_DAY:
                raise ValueError(f"limits.{f.name} must be at most a day, got {value!r}")


@dataclass
class ModelSpec:
    """One model: its ``name`` in requests, its checkpoint ``path`` (ours, our Hugging Face exports,
    the Hugging Face models we read), its ``kind`` (None: read from the checkpoint) and ``precision``."""

    name: str
    path: str
    kind: str | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        check_types(self, "a model's ")
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"model name {self.name!r}: use letters, digits, '-', '_' and '.'")
        if self.kind is not None:
            from scratchformer.tasks.shared.kinds import KINDS  # (loads the formats: only when named)

            if self.kind not in KINDS:
                raise ValueError(f"model {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"model {self.name!r}: precision must be one of {PRECISIONS}, got {self.precision!r}"
            )
        if not Path(self.path).is_dir():
            raise ValueError(f"model {self.name!r}: {self.path} is not a directory")

    @classmethod
    def parse(cls, text: str, precision: str = "fp32") -> ModelSpec:
        """``DIR`` or ``NAME=DIR`` (the command line's --checkpoint); a bare DIR is named after its
        folder (its parent's name for a run's ``best`` or ``last``)."""
        name, sep, path = text.partition("=")
        if not sep:
            path, folder = text, Path(text).resolve()
            name = folder.parent.name if folder.name in ("best", "last") else folder.name
        return cls(name, path, precision=precision)


@dataclass
class ServeConfig:
    """The server: its models, address, threads and limits; ``api_key``: requests to /v1/ need
    ``Authorization: Bearer KEY``; ``cors_origins``: the browser origins allowed to call it (none:
    CORS off); ``drain_s``: after SIGTERM, how long /ready answers 503 while requests still run;
    ``root_path``: the path prefix a proxy serves it under (``/scratchformer``: the proxy forwards
    ``/scratchformer/v1/...`` as ``/v1/...``), as uvicorn's ``--root-path``; ``batching``:
    "continuous" (translators and captioners: an input joins the running decode at its next step)
    or "whole" (every model: a batch decodes to its end before the next one starts)."""

    models: list[ModelSpec]
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int | None = None  # torch's threads, set once (None: torch's default)
    device: str = "cpu"
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    drain_s: float = 5.0
    root_path: str = ""
    batching: str = "continuous"
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        check_types(self)
        if not self.models:
            raise ValueError("no model to serve: give --checkpoint DIR (or models: in the config file)")
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two models are named {twice[0]!r}: name them (--checkpoint NAME=DIR)")
        if not self.host:
            raise ValueError("host must be an address (127.0.0.1, 0.0.0.0, ...), got ''")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise ValueError(f"threads must be in 1..{MAX_THREADS}, got {self.threads}")
        if not 0 <= self.drain_s <= A_DAY:
            raise ValueError(f"drain_s must be 0 to {A_DAY} seconds, got {self.drain_s}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        if self.root_path and not (
            self.root_path.startswith("/") and not self.root_path.endswith("/") and "//" not in self.root_path
        ):
            raise ValueError(
                f"root_path must be a path such as /scratchformer (one leading '/', none at the end), "
                f"got {self.root_path!r}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeConfig:
        """A config file's contents; an unknown key is an error naming it."""
        _known(data, cls, "the config")
        models = data.get("models")
        if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
            raise ValueError("models: expected a list of {name, path, kind, precision}")
        for m in models:
            _known(m, ModelSpec, "a model")
        limits = data.get("limits", {})
        _known(limits, Limits, "limits")
        return cls(**{**data, "models": [ModelSpec(**m) for m in models], "limits": Limits(**limits)})

    @classmethod
    def from_file(cls, path: str | Path) -> ServeConfig:
        """A YAML (or JSON: YAML reads it) file. Relative model paths are read from the file's folder."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"{path}: cannot read the serve config ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping (models:, port:, limits: ...)")
        for m in data.get("models") or []:
            if isinstance(m, dict) and isinstance(m.get("path"), str):
                m["path"] = str(Path(path).parent / m["path"])
        return cls.from_dict(data)


def _known(data: Any, cls: type, what: str) -> None:
    """``data`` is a mapping of ``cls``'s fields (:func:`~scratchformer.core.checks.reject_unknown`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a mapping, got {type(data).__name__}")
    reject_unknown(data, [f.name for f in dataclasses.fields(cls)], what)


def check_types(config: Any, where: str = "") -> None:
    """Each field of the dataclass ``config`` holds a value of its annotated type, or a ValueError
    (a bad value in the config) names the field and the type: a bool is no number, an integer is a
    number, a number is finite, and None is allowed only where the annotation says ``| None``."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, expected = getattr(config, f.name), hints[f.name]
        if not _is(value, expected):
            raise ValueError(f"{where}{f.name} must be {_describe(expected)}, got {value!r}")


def _is(value: Any, expected: Any) -> bool:
    if isinstance(expected, types.UnionType):
        return any(_is(value, option) for option in typing.get_args(expected))
    if typing.get_origin(expected) is list:
        (item,) = typing.get_args(expected)
        return isinstance(value, list) and all(_is(v, item) for v in value)
    if expected is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if expected is float:  # a finite number
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, expected)


def _describe(expected: Any) -> str:
    if isinstance(expected, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(expected))
    if typing.get_origin(expected) is list:
        return f"a list ({_describe(typing.get_args(expected)[0])} each)"
    words = {int: "an integer", float: "a finite number", str: "a string", type(None): "null"}
    return words.get(expected, f"a {getattr(expected, '__name__', expected)}")
