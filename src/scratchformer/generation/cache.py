"""The key/value cache of incremental decoding: each step computes its new position only, never
the prefix again (the attention layers read and extend it: :mod:`scratchformer.core.attention`).

Appending without autograd writes into a buffer that doubles its length when full, so a step
copies only the new position, not the whole prefix as ``torch.cat`` would (a speed path, tested
equal to concatenation in tests/fast/test_fast.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["DecoderCache", "DecoderLayerCache", "KVCache"]


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, split into heads: (B, H, S, d_k).

    Self-attention appends the new positions' keys/values at each step; cross-attention sets the
    encoder memory's keys/values once and reuses them ("static"). ``k`` and ``v`` are views of the
    buffer's first S positions.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    _buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys/values (B, H, S_new, d_k) of new positions; returns all of them (B, H, S, d_k)."""
        if self.k is None or self.v is None:
            self.k, self.v, self._buffers = k, v, None
            return k, v
        if torch.is_grad_enabled() and (k.requires_grad or self.k.requires_grad):
            self.k, self.v, self._buffers = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2), None
            return self.k, self.v
        old, new = self.k.shape[2], self.k.shape[2] + k.shape[2]
        buffers = self._buffers
        if buffers is None or buffers[0].shape[2] < new or not _is_prefix_view(self.k, buffers[0]):
            size = (*k.shape[:2], max(2 * new, 16), k.shape[3])
            buffers = (k.new_empty(size), v.new_empty(size[:3] + v.shape[3:]))
            buffers[0][:, :, :old] = self.k
            buffers[1][:, :, :old] = self.v
            self._buffers = buffers
        buffers[0][:, :, old:new] = k
        buffers[1][:, :, old:new] = v
        self.k, self.v = buffers[0][:, :, :new], buffers[1][:, :, :new]
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) in that order (beam search reshuffles hypotheses)."""
        if self.k is None or self.v is None:
            return
        length, buffers = self.k.shape[2], self._buffers
        if (
            buffers is not None
            and _is_prefix_view(self.k, buffers[0])
            and _is_prefix_view(self.v, buffers[1])
        ):
            k_buffer, v_buffer = buffers[0].index_select(0, index), buffers[1].index_select(0, index)
            self._buffers = (k_buffer, v_buffer)  # keeps its spare room for the next appends
            self.k, self.v = k_buffer[:, :, :length], v_buffer[:, :, :length]
        else:
            self.k, self.v, self._buffers = self.k.index_select(0, index), self.v.index_select(0, index), None


def _is_prefix_view(t: Tensor, buffer: Tensor) -> bool:
    """Whether ``t`` is still the first positions of ``buffer`` (nobody replaced the cache's k/v)."""
    return (
        t.data_ptr() == buffer.data_ptr()
        and t.stride() == buffer.stride()
        and t.shape[:2] == buffer.shape[:2]
    )


@dataclass
class DecoderLayerCache:
    """Keys/values of one decoder layer: growing self-attention, fixed cross-attention."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)


class DecoderCache:
    """Incremental-decoding state of a whole decoder stack (one entry per layer).

    Example:
        >>> cache = DecoderCache(len(model.decoder.layers))
        >>> logits = model.decode(tokens[:, -1:], memory, cache=cache)   # one new position per call
    """

    def __init__(self, num_layers: int):
        self.layers = [DecoderLayerCache() for _ in range(num_layers)]

    @classmethod
    def of(cls, layers: list[DecoderLayerCache]) -> DecoderCache:
        """A cache over these layer caches (shared, not copied): one member's part of an ensemble's."""
        cache = cls(0)
        cache.layers = layers
        return cache

    def __len__(self) -> int:
        """Number of target positions already decoded."""
        return len(self.layers[0].self_attn) if self.layers else 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) in that order, e.g. the surviving beams."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)
