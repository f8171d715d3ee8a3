"""Input checks: bad input becomes an error naming the argument, the expected and the received,
before any work: never a silent broadcast, an index crash in an embedding or a NaN later on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_attention_inputs", "check_features", "check_kernel_inputs", "check_mask", "check_tokens"]

_INTEGER_DTYPES = (torch.int64, torch.int32)  # what an embedding lookup takes


def check_features(
    name: str, x: Tensor, letters: str, width: int | None, batch: int | None = None, dims: int | None = 3
) -> None:
    """``x`` must be a floating tensor of ``dims`` dimensions (None: any) ending in ``width`` (None:
    any), e.g. ``letters`` "(B, T, D)", and of batch size ``batch`` if given."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {letters}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor {letters}, got dtype {x.dtype}")
    if dims is not None and x.dim() != dims:
        raise ValueError(
            f"{name}: expected shape {letters} ({dims} dims), got {tuple(x.shape)} ({x.dim()} dims)"
        )
    if x.dim() == 0 or x.shape[-1] != (x.shape[-1] if width is None else width):
        raise ValueError(f"{name}: expected shape {letters} with last dim {width}, got {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name}: expected batch size B={batch} in {letters}, got {tuple(x.shape)}")


def check_tokens(name: str, tokens: Tensor, vocab_size: int, max_len: int | None = None) -> None:
    """``tokens`` must be integer ids of shape ``(B, L)``, every id in ``[0, vocab_size)``, L <= max_len."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of token ids (B, L), got {type(tokens).__name__}")
    if tokens.dtype not in _INTEGER_DTYPES:
        raise TypeError(
            f"{name}: expected integer token ids (torch.long or torch.int32), got dtype {tokens.dtype}"
        )
    if tokens.dim() != 2:
        raise ValueError(
            f"{name}: expected shape (B, L) of token ids, got {tuple(tokens.shape)} ({tokens.dim()} dims)"
        )
    if max_len is not None and tokens.shape[1] > max_len:
        raise ValueError(
            f"{name}: sequence length {tokens.shape[1]} exceeds the configured maximum max_len={max_len}"
        )
    if tokens.numel() and not torch.compiler.is_compiling():
        low, high = (int(t) for t in torch.aminmax(tokens))  # one pass, one host sync
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name}: token id {low if low < 0 else high} is outside the vocabulary range "
                f"[0, {vocab_size})"
            )


def check_mask(
    name: str,
    mask: Tensor,
    allowed: Sequence[tuple[int, ...]],
    letters: Sequence[str],
    broadcast: bool = False,
) -> None:
    """``mask`` must be ``torch.bool`` (True = may attend) with one of the ``allowed`` shapes; with
    ``broadcast`` any dimension but the last (B, H or T) may also be 1."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name}: expected dtype torch.bool (True = may attend), got {mask.dtype}; "
            "float/additive masks are not accepted"
        )

    def fits(shape: tuple[int, ...]) -> bool:
        return mask.dim() == len(shape) and all(
            m == s or (broadcast and m == 1 and i < len(shape) - 1)
            for i, (m, s) in enumerate(zip(mask.shape, shape))
        )

    if not any(fits(tuple(s)) for s in allowed):
        expected = " or ".join(f"{letter}={tuple(s)}" for letter, s in zip(letters, allowed))
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(mask.shape)}")


def check_kernel_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    """q (B, H, T, d_k), k (B, H, S, d_k), v (B, H, S, d_v), mask bool broadcastable to (B, H, T, S)."""
    if (
        any(t.dim() != 4 for t in (q, k, v))
        or k.shape[:-1] != v.shape[:-1]
        or q.shape[:2] != k.shape[:2]
        or q.shape[-1] != k.shape[-1]
    ):
        raise ValueError(
            f"q, k, v: expected (B, H, T, d_k), (B, H, S, d_k), (B, H, S, d_v), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if mask is not None:
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        check_mask("mask", mask, [target], ["(B, H, T, S)"], broadcast=True)


def check_attention_inputs(
    query: Tensor, key: Tensor | None, value: Tensor | None, width: int, cache: Any, static_kv: bool
) -> tuple[int, int, int]:
    """query (B, T, D), key and value (B, S, D) or None, a cache of batch B (and memory S): (B, T, D)."""
    check_features("query", query, "(B, T, D)", width)
    B = query.shape[0]
    for name, t in (("key", key), ("value", value)):
        if t is not None:
            check_features(name, t, "(B, S, D)", width, batch=B)
    if key is not None and value is not None and value.shape[1] != key.shape[1]:
        raise ValueError(
            f"value: expected the key's shape (B, S, D)={tuple(key.shape)}, got {tuple(value.shape)}"
        )
    if static_kv and key is None and (cache is None or cache.k is None):
        raise ValueError("key: cross-attention (static_kv) needs the memory (B, S, D) on its first call")
    if (
        static_kv
        and key is not None
        and cache is not None
        and cache.k is not None
        and key.shape[1] != cache.k.shape[2]
    ):
        raise ValueError(
            f"memory: the cache holds keys/values of a memory of length {cache.k.shape[2]}, "
            f"got length {key.shape[1]}; use a new cache for a new memory"
        )
    if cache is not None and cache.k is not None and cache.k.shape[0] != B:
        raise ValueError(
            f"cache: holds keys for batch size {cache.k.shape[0]}, but the input has batch size {B} "
            "(reorder the cache and its inputs together)"
        )
    return B, query.shape[1], width
