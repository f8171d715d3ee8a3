"""An ensemble of encoder-decoders decoded as one model: at every step the next-token
log-probabilities of the members are averaged (a renormalised geometric mean of their
distributions), so greedy, beam and sampled decoding run over the ensemble unchanged::

    log p(y_t | y_<t, x) = log_softmax( (1/M) sum_m log_softmax(decoder_m(y_<t, memory_m)) )

Each member encodes the input once and keeps its own key/value cache; the ensemble's cache is their
layer caches side by side, so beam search reorders all of them at once. Members must share the
target vocabulary. Members that read the same input take it as it is; members that read different
features (e.g. two image encoders) take them packed side by side (:meth:`Ensemble.pack`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from scratchformer.generation.cache import DecoderCache

__all__ = ["Ensemble"]


class _Layers(nn.Module):
    """The members' decoder layers, in order: the ensemble's cache has one entry per layer."""

    def __init__(self, layers: Sequence[nn.Module]):
        super().__init__()
        self.layers = list(layers)  # a plain list: the members own these modules


class Ensemble(nn.Module):
    """M encoder-decoders with one target vocabulary as one: ``encode`` runs every member's encoder,
    ``decode`` returns the mean of their next-token log-probabilities (B, T, V).

    Args:
        models: the members (each with ``encode``/``decode``/``decoder``/``config``, e.g.
            :class:`~scratchformer.CaptioningTransformer` or :class:`~scratchformer.Transformer`).
        input_shapes: None if every member reads the same input (B, ...); else each member's input
            shape without the batch dimension, and the input is :meth:`pack`'s (B, sum of their sizes).
    """

    def __init__(self, models: Sequence[nn.Module], input_shapes: Sequence[Sequence[int]] | None = None):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        configs = [m.config for m in models]
        vocab = {getattr(c, "tgt_vocab_size", None) for c in configs}
        pads = {c.pad_id for c in configs}
        if len(vocab) != 1 or len(pads) != 1:
            raise ValueError(
                "ensemble members must share the target vocabulary and pad id: "
                f"sizes {sorted(map(str, vocab))}, pad ids {sorted(map(str, pads))}"
            )
        if input_shapes is not None and len(input_shapes) != len(models):
            raise ValueError(f"input_shapes: {len(input_shapes)} shapes for {len(models)} models")
        self.members = nn.ModuleList(models)
        self.input_shapes = None if input_shapes is None else [tuple(s) for s in input_shapes]
        # the first member's config (vocabulary, ids, input) with the shortest max_len: what decoding reads
        self.config = dataclasses.replace(configs[0], max_len=min(c.max_len for c in configs))
        self.depths = [len(m.decoder.layers) for m in models]
        self.decoder = _Layers([layer for m in models for layer in m.decoder.layers])
        self.training = any(m.training for m in models)  # the members' mode (not set on them)

    @staticmethod
    def pack(inputs: Sequence[Tensor]) -> Tensor:
        """Each member's input (B, ...) flattened and side by side: (B, sum of sizes), in the first
        input's dtype. Build the ensemble with ``input_shapes=[x.shape[1:] for x in inputs]``."""
        if len({x.shape[0] for x in inputs}) != 1:
            raise ValueError(f"pack: inputs of different batch sizes {[x.shape[0] for x in inputs]}")
        return torch.cat([x.flatten(1).to(inputs[0].dtype) for x in inputs], dim=1)

    def _unpack(self, src: Tensor) -> list[Tensor]:
        if self.input_shapes is None:
            return [src] * len(self.members)
        sizes = [math.prod(s) for s in self.input_shapes]
        if src.dim() != 2 or src.shape[1] != sum(sizes):
            raise ValueError(
                f"ensemble input: expected (B, {sum(sizes)}) packed inputs of shapes {self.input_shapes}, "
                f"got {tuple(src.shape)}"
            )
        return [x.view(-1, *s) for x, s in zip(src.split(sizes, dim=1), self.input_shapes)]

    def source_padding_mask(self, src: Tensor) -> Tensor | None:
        """The first member's (members that read one input share it; packed inputs have none)."""
        return self.members[0].source_padding_mask(self._unpack(src)[0])

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Every member's memory (B, N_m, D_m), flattened and side by side: (B, sum N_m * D_m)."""
        memories = [m.encode(x, src_padding_mask) for m, x in zip(self.members, self._unpack(src))]
        self._memory_shapes = [tuple(x.shape[1:]) for x in memories]
        return torch.cat([x.flatten(1) for x in memories], dim=1)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        *,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """The members' mean next-token log-probabilities (B, T, V) for ``tgt`` (B, T) (with a
        ``cache``: only the new tokens) given :meth:`encode`'s ``memory``."""
        sizes = [math.prod(s) for s in self._memory_shapes]
        memories = [x.view(-1, *s) for x, s in zip(memory.split(sizes, dim=1), self._memory_shapes)]
        total: Tensor | None = None
        first = 0
        for model, mem, depth in zip(self.members, memories, self.depths):
            part = None if cache is None else DecoderCache.of(cache.layers[first : first + depth])
            first += depth
            log_p = torch.log_softmax(model.decode(tgt, mem, src_padding_mask, cache=part).float(), dim=-1)
            total = log_p if total is None else total + log_p
        assert total is not None
        return total / len(self.members)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher forcing: the mean log-probabilities (B, T, V) of ``tgt`` (B, T) given ``src``."""
        mask = self.source_padding_mask(src)
        return self.decode(tgt, self.encode(src, mask), mask)
