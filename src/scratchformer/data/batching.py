"""Batches that waste little on padding: sort by length within large shuffled pools.

Shuffle everything, cut it into pools of ``pool_batches`` batches, sort each pool by length,
cut the pools into batches (of ``batch_size`` examples, or of at most ``max_tokens`` padded
tokens), then shuffle the batches. Deterministic for a given (seed, epoch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["length_bucketed_batches"]


def length_bucketed_batches(
    lengths: Sequence[int],
    batch_size: int | None = None,
    *,
    max_tokens: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    pool_batches: int = 50,
) -> list[list[int]]:
    """Index lists, one per batch. Give ``batch_size`` (examples) or ``max_tokens`` (padded tokens)."""
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of batch_size or max_tokens")
    if (batch_size is not None and batch_size < 1) or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size and max_tokens must be positive, got {batch_size}, {max_tokens}")
    if max_tokens is not None and max(lengths, default=0) > max_tokens:
        raise ValueError(f"an example of {max(lengths)} tokens does not fit max_tokens={max_tokens}")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    n = len(lengths)
    order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    pool_size = pool_batches * (batch_size or max(1, max_tokens // max(1, max(lengths, default=1))))  # type: ignore[operator]
    batches: list[list[int]] = []
    for start in range(0, n, pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: lengths[i])
        if batch_size is not None:
            batches += [pool[i : i + batch_size] for i in range(0, len(pool), batch_size)]
            continue
        batch: list[int] = []
        longest = 0
        for i in pool:
            if batch and max(longest, lengths[i]) * (len(batch) + 1) > max_tokens:  # type: ignore[operator]
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, lengths[i])
        if batch:
            batches.append(batch)
    if shuffle:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches
