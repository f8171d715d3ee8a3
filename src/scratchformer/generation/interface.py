"""What decoding needs of a model: the :class:`EncoderDecoder` interface of the
:class:`~scratchformer.Transformer` and the :class:`~scratchformer.CaptioningTransformer`.

Greedy and beam search feed one new token per step and reuse a :class:`~scratchformer.DecoderCache`:
each step costs one position, not the whole prefix again, and the encoder's keys/values for
cross-attention are computed once. ``use_cache=False`` (greedy) recomputes the prefix, for tests
and benchmarks only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from scratchformer.core.decoder import Decoder
from scratchformer.generation.cache import DecoderCache

__all__ = [
    "EmbedsTarget",
    "EncoderDecoder",
    "QueryMap",
    "check_logits",
    "max_decode_length",
    "start_decoding",
    "target_embedding",
]


class EncoderDecoder(Protocol):
    """What decoding needs: ``config`` with ``pad_id``, ``tgt_vocab_size`` and ``max_len``; the
    source encoded once; the decoder fed new tokens with a cache."""

    config: Any
    decoder: Decoder
    training: bool

    def source_padding_mask(self, src: Tensor) -> Tensor | None: ...

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor: ...

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        *,
        cache: DecoderCache | None = None,
    ) -> Tensor: ...


@runtime_checkable
class EmbedsTarget(Protocol):
    """An encoder-decoder that gives its decoder's input apart (:class:`~scratchformer.Transformer`, the
    captioning Transformer): what :class:`~scratchformer.generation.fast_step.DecoderStep` needs
    besides the decoder stack."""

    def embed_target(self, tgt: Tensor, offset: int | Tensor = 0) -> Tensor:
        """tgt (B, T) ids at positions offset, offset + 1, ... (``offset`` (B,): one per row) ->
        (B, T, D), before dropout."""
        ...


@runtime_checkable
class QueryMap(Protocol):
    """An attention layer with its W^Q as a linear map of its own, ``q_proj`` (D -> D), beside the
    stacked [W^Q; W^K; W^V] (:class:`~scratchformer.fast.quantized.QuantizedMultiHeadAttention`:
    int8 rows cannot be sliced): a decoding step projects its queries with it."""

    q_proj: nn.Module


def target_embedding(model: object) -> Callable[[Tensor, int | Tensor], Tensor] | None:
    """``model``'s decoder input for tokens (N, T) at position ``offset``, as its ``decode`` computes
    it in eval mode: :meth:`EmbedsTarget.embed_target`; None for a model without it."""
    return model.embed_target if isinstance(model, EmbedsTarget) else None


def max_decode_length(model: EncoderDecoder, src_len: int, max_len_a: float, max_len_b: int) -> int:
    """New tokens allowed for a source of ``src_len``: a * S + b (fairseq), within the model's max_len."""
    return max(1, min(int(max_len_a * src_len + max_len_b), model.config.max_len - 1))


def check_logits(logits: Tensor, step: int) -> None:
    """NaN next-token scores end decoding with an error (argmax or top-k would pick garbage)."""
    if bool(torch.isnan(logits).any()):
        raise FloatingPointError(f"decoding: the model's logits are NaN at step {step} (check its weights)")


def start_decoding(
    model: EncoderDecoder, src: Tensor, bos_id: int, eos_id: int, src_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor | None, DecoderCache]:
    """Check the ids, encode the source once: (memory, source mask, an empty cache)."""
    if bos_id == eos_id:
        raise ValueError(f"bos_id and eos_id are both {bos_id}: every sentence would end before it begins")
    if eos_id == model.config.pad_id:
        raise ValueError(
            f"eos_id={eos_id} equals the model's pad_id: padding is never generated, so EOS could not be"
        )
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= token < model.config.tgt_vocab_size:
            raise ValueError(
                f"{name}={token} is outside the target vocabulary [0, {model.config.tgt_vocab_size})"
            )
    if model.training:
        warnings.warn(
            "decoding: the model is in training mode (dropout on); call model.eval() first", stacklevel=3
        )
    if src_padding_mask is None:
        src_padding_mask = model.source_padding_mask(src)
    memory = model.encode(src, src_padding_mask)
    if src_padding_mask is not None and bool(src_padding_mask.all()):
        src_padding_mask = None  # no padding: every step's cross-attention runs unmasked (read once, here)
    return memory, src_padding_mask, DecoderCache(len(model.decoder.layers))
