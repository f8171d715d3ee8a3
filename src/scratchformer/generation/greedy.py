"""Greedy decoding: the most likely next token at every step, with the key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder
from scratchformer.generation.rules import default_rules
from scratchformer.generation.stepwise import decode_stepwise

__all__ = ["greedy_decode"]


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    src_padding_mask: Tensor | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 10,
    use_cache: bool = True,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Pick the most likely next token (never BOS or pad) until every sentence has produced ``eos_id``.

    Args:
        model: the Transformer (put it in eval mode first).
        src: (B, S) source token ids, padded with ``pad_id``.
        bos_id, eos_id: start and end-of-sentence ids.
        src_padding_mask: (B, S) bool, True at real tokens; defaults to ``src != pad_id``.
        max_len_a, max_len_b: at most ``a * S + b`` new tokens.
        use_cache: incremental decoding with a key/value cache (default) or prefix recomputation.
        return_logits: also return the (B, L, V) logits of every step.

    Returns:
        (B, L) generated ids without the BOS, each sentence ending with EOS (forced at the length
        limit), then pad (or EOS when the config has no pad_id); and the logits if asked.
        :func:`~scratchformer.generation.generate` offers the other options (prefix, n-gram and
        repetition rules, minimum length).
    """
    rules = default_rules(model, src, bos_id, eos_id, max_len_a, max_len_b)
    tokens, _, logits = decode_stepwise(
        model, src, rules, src_padding_mask=src_padding_mask, use_cache=use_cache, return_logits=return_logits
    )
    return (tokens, logits) if return_logits else tokens  # type: ignore[return-value]
