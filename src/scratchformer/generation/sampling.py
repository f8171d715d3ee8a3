"""Ancestral sampling: draw each next token from the model's distribution, with the key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder, check_logits, max_decode_length, start_decoding

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
        (B * num_samples, L) ids (L generated steps) without the BOS, each ending with EOS (forced at the length
        limit), then pad (or EOS when the config has no pad_id).
    """
    if num_samples < 1 or not temperature > 0:
        raise ValueError(f"num_samples must be >= 1 and temperature > 0, got {num_samples} and {temperature}")
    memory, src_padding_mask, never, cache = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    memory = memory.repeat_interleave(num_samples, dim=0)
    if src_padding_mask is not None:
        src_padding_mask = src_padding_mask.repeat_interleave(num_samples, dim=0)
    B = memory.shape[0]
    fill_id = model.config.pad_id if model.config.pad_id is not None else eos_id
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=memory.device)
    finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
    steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
    for step in range(steps):
        logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1].float()
        check_logits(logits, step)
        probs = torch.softmax(logits.index_fill(1, never, float("-inf")) / temperature, dim=-1)
        next_token = torch.multinomial(probs, 1, generator=generator)[:, 0]
        if step == steps - 1:
            next_token.fill_(eos_id)
        next_token = next_token.masked_fill(finished, fill_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    return tokens[:, 1:]
