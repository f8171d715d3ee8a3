"""Ancestral sampling: draw each next token from the model's distribution, with the key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder
from scratchformer.generation.rules import default_rules
from scratchformer.generation.stepwise import decode_stepwise

__all__ = ["sample_decode"]


@torch.no_grad()
def sample_decode(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    num_samples: int = 1,
    temperature: float = 1.0,
    src_padding_mask: Tensor | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 10,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sample ``num_samples`` sequences per source from softmax(logits / temperature) (never BOS or pad).

    The source is encoded once; sample j of source i is row ``i * num_samples + j``.

    Args:
        model: an encoder-decoder (put it in eval mode first).
        src: (B, S) source token ids, or what the model encodes (e.g. image features (B, R, D_img)).
        bos_id, eos_id: start and end-of-sentence ids.
        num_samples: sequences per source.  temperature: > 0; towards 0 it approaches greedy decoding.
        src_padding_mask: (B, S) bool, True at real tokens (default: the model's).
        max_len_a, max_len_b: at most ``a * S + b`` new tokens (within the model's ``max_len``).
        generator: a ``torch.Generator`` on the model's device, for reproducible samples.

    Returns:
        (B * num_samples, L) ids (L generated steps) without the BOS, each ending with EOS (forced at the
        length limit), then pad (or EOS when the config has no pad_id).
        :func:`~scratchformer.generation.generate` adds top-k, top-p, per-sentence seeds and the other rules.
    """
    if num_samples < 1 or not temperature > 0:
        raise ValueError(f"num_samples must be >= 1 and temperature > 0, got {num_samples} and {temperature}")
    rules = default_rules(
        model, src, bos_id, eos_id, max_len_a, max_len_b,
        do_sample=True, temperature=temperature, num_return_sequences=num_samples,
    )  # fmt: skip
    return decode_stepwise(model, src, rules, src_padding_mask=src_padding_mask, generators=generator)[0]
