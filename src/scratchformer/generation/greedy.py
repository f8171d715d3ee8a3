"""Greedy decoding: the most likely next token at every step, with the key/value cache."""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder, check_logits, max_decode_length, start_decoding

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
        (B, L) generated ids without the BOS, each sentence ending with EOS (forced at the
        length limit), then pad (or EOS when the config has no pad_id); and the logits if asked.
    """
    memory, src_padding_mask, never, cache = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    B = src.shape[0]
    fill_id = model.config.pad_id if model.config.pad_id is not None else eos_id
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = cache if use_cache else None
    all_logits = []
    steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
    for step in range(steps):
        if cache is not None:
            logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1]
        else:
            logits = model.decode(tokens, memory, src_padding_mask)[:, -1]
        check_logits(logits, step)
        all_logits.append(logits)
        next_token = logits.index_fill(1, never, float("-inf")).argmax(dim=-1)
        if step == steps - 1:
            next_token.fill_(eos_id)  # the length limit: every sentence ends here (as beam search)
        next_token = next_token.masked_fill(finished, fill_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    out = tokens[:, 1:]
    return (out, torch.stack(all_logits, dim=1)) if return_logits else out
