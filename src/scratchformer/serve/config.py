"""What ``scratchformer serve`` runs: the models (a name, a checkpoint directory, a precision), where
it listens, and the limits that keep it answering under any load. A YAML (or JSON) file, or flags.

models:
  - {name: de-en, path: runs/multi30k/best, precision: int8}
  - {name: imdb, path: runs/imdb/best}
port: 8000
limits: {max_batch_size: 32, max_wait_ms: 5, timeout_s: 30}
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Limits", "ModelSpec", "ServeConfig"]

KINDS = ("translation", "text_classifier", "captioning", "embedding")
PRECISIONS = ("fp32", "bf16", "int8")


@dataclass
class Limits:
    """Every bound the server enforces, and the micro-batcher's settings (per model)."""

    max_batch_size: int = 32  # inputs decoded together
    max_batch_tokens: int = 4096  # inputs x the longest one's tokens, per batch
    max_wait_ms: float = 5.0  # how long the first queued input waits for others to join its batch
    max_queue: int = 512  # inputs waiting per model; more: 429 with Retry-After
    max_concurrency: int = 1024  # requests in flight; more: 429 with Retry-After
    max_body_bytes: int = 10_000_000  # a request's body; more: 413
    max_items: int = 64  # inputs in one request; more: 422
    max_input_tokens: int = 512  # tokens of one input; more: 422
    max_new_tokens: int = 256  # a request's max_new_tokens; more: 422
    max_image_pixels: int = 40_000_000  # width x height of an uploaded image; more: 413
    timeout_s: float = 30.0  # from a request's arrival to its answer; later: 504 (its queued work dropped)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"limits.{f.name} must be a positive number, got {value!r}")
            if f.type == "int" and not isinstance(value, numbers.Integral):
                raise ValueError(f"limits.{f.name} must be an integer, got {value!r}")


@dataclass
class ModelSpec:
    """One model: its ``name`` in requests, its checkpoint ``path`` (ours, our Hugging Face exports,
    the Hugging Face models we read), its ``kind`` (None: read from the checkpoint) and ``precision``."""

    name: str
    path: str
    kind: str | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"model name {self.name!r}: use letters, digits, '-', '_' and '.'")
        if self.kind is not None and self.kind not in KINDS:
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
    CORS off); ``drain_s``: after SIGTERM, how long /ready answers 503 while requests still run."""

    models: list[ModelSpec]
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int | None = None  # torch's threads, set once (None: torch's default)
    device: str = "cpu"
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    drain_s: float = 5.0
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("no model to serve: give --checkpoint DIR (or models: in the config file)")
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two models are named {twice[0]!r}: name them (--checkpoint NAME=DIR)")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not self.drain_s >= 0:
            raise ValueError(f"drain_s must be >= 0 seconds, got {self.drain_s}")

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
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a mapping, got {type(data).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{what}: unknown key {unknown[0]!r}; expected some of {sorted(fields)}")
