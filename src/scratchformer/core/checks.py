"""Input checks that turn bad input into an error naming the argument, the expected and the received.

Every public ``forward`` calls these first, so a wrong shape never becomes a silent broadcast, an
index crash deep inside an embedding, or a NaN three layers later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["DictConfig", "check_features", "check_last_dim", "check_mask", "check_model_config", "check_tokens"]

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_features(name: str, x: Tensor, letters: str, width: int, batch: int | None = None) -> None:
    """``x`` must be a floating tensor of shape ``(B, L, width)``; ``letters`` names it, e.g. "(B, T, D)"."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {letters}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor {letters}, got dtype {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"{name}: expected shape {letters} (3 dims), got {_shape(x)} ({x.dim()} dims)")
    if x.shape[-1] != width:
        raise ValueError(f"{name}: expected shape {letters} with last dim {width}, got {_shape(x)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name}: expected batch size B={batch} in {letters}, got {_shape(x)}")


def check_last_dim(name: str, x: Tensor, width: int, letters: str = "(..., D)") -> None:
    """``x`` must be a floating tensor whose last dimension is ``width``."""
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor {letters}, got dtype {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != width:
        raise ValueError(f"{name}: expected shape {letters} with last dim {width}, got {_shape(x)}")


def check_tokens(name: str, tokens: Tensor, vocab_size: int, max_len: int | None = None) -> None:
    """``tokens`` must be integer ids of shape ``(B, L)`` with every id in ``[0, vocab_size)``."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of token ids (B, L), got {type(tokens).__name__}")
    if tokens.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name}: expected integer token ids (torch.long), got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(
            f"{name}: expected shape (B, L) of token ids, got {_shape(tokens)} ({tokens.dim()} dims)"
        )
    if max_len is not None and tokens.shape[1] > max_len:
        raise ValueError(
            f"{name}: sequence length {tokens.shape[1]} exceeds the configured maximum max_len={max_len}"
        )
    if tokens.numel() and not torch.compiler.is_compiling():
        low, high = (int(t) for t in torch.aminmax(tokens))  # one pass, one host sync
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name}: token id {bad} is outside the vocabulary range [0, {vocab_size})"
            )


def check_mask(
    name: str,
    mask: Tensor,
    allowed: Sequence[tuple[int, ...]],
    letters: Sequence[str],
) -> None:
    """``mask`` must be ``torch.bool`` (True = may attend) with one of the ``allowed`` shapes."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name}: expected dtype torch.bool (True = may attend), got {mask.dtype}; "
            "float/additive masks are not accepted"
        )
    if _shape(mask) not in [tuple(s) for s in allowed]:
        expected = " or ".join(f"{l}={tuple(s)}" for l, s in zip(letters, allowed))
        raise ValueError(f"{name}: expected shape {expected}, got {_shape(mask)}")


def check_model_config(config: object, positive: Sequence[str], vocab_sizes: Sequence[int]) -> None:
    """Shared checks of TransformerConfig and EncoderConfig: sizes, D divisible by H, choices, pad id."""
    for name in positive:
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")
    d_model, num_heads = getattr(config, "d_model"), getattr(config, "num_heads")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads} (d_k = D / H)")
    for name, choices in (("positional", ("sinusoidal", "learned")), ("activation", ("relu", "gelu"))):
        if getattr(config, name) not in choices:
            raise ValueError(f"{name}: expected one of {choices}, got {getattr(config, name)!r}")
    dropout = getattr(config, "dropout")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    pad_id = getattr(config, "pad_id")
    if pad_id is not None and not 0 <= pad_id < min(vocab_sizes):
        raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {min(vocab_sizes)})")


C = TypeVar("C", bound="DictConfig")


class DictConfig:
    """``to_dict``/``from_dict`` for the model configuration dataclasses (saved as JSON in
    checkpoints); an unknown field is an error, never silently dropped."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
        return cls(**data)
