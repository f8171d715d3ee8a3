"""Autoregressive decoding for the encoder-decoder :class:`~scratchformer.Transformer`.

Greedy decoding feeds one new token per step and reuses a :class:`~scratchformer.DecoderCache`:
each step costs one position, not the whole prefix again. ``use_cache=False`` recomputes the
prefix (for tests and benchmarks only).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from scratchformer.transformer import Transformer

__all__ = ["greedy_decode", "max_decode_length"]


def max_decode_length(model: Transformer, src_len: int, max_len_a: float, max_len_b: int) -> int:
    """New tokens allowed for a source of ``src_len``: a * S + b (fairseq), within the model's max_len."""
    return max(1, min(int(max_len_a * src_len + max_len_b), model.config.max_len - 1))


@torch.no_grad()
def greedy_decode(
    model: Transformer,
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
        (B, L) generated ids without the BOS, ending with EOS (then pad, or EOS when the
        config has no pad_id) for finished sentences; and the logits if asked.
    """
    if eos_id == model.config.pad_id:
        raise ValueError(f"eos_id={eos_id} equals the model's pad_id: padding is never generated, so EOS could not be")
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= token < model.config.tgt_vocab_size:
            raise ValueError(f"{name}={token} is outside the target vocabulary [0, {model.config.tgt_vocab_size})")
    if model.training:
        warnings.warn("greedy_decode: the model is in training mode (dropout on); call model.eval() first", stacklevel=2)
    if src_padding_mask is None:
        src_padding_mask = model.source_padding_mask(src)
    memory = model.encode(src, src_padding_mask)
    B = src.shape[0]
    fill_id = model.config.pad_id if model.config.pad_id is not None else eos_id
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = model.decoder.new_cache() if use_cache else None
    # Never generate padding or a second BOS (fairseq does the same).
    never = torch.tensor([bos_id] + ([model.config.pad_id] if model.config.pad_id is not None else []), device=src.device)
    all_logits = []
    for _ in range(max_decode_length(model, src.shape[1], max_len_a, max_len_b)):
        if cache is not None:
            logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1]
        else:
            logits = model.decode(tokens, memory, src_padding_mask)[:, -1]
        all_logits.append(logits)
        next_token = logits.index_fill(1, never, float("-inf")).argmax(dim=-1).masked_fill(finished, fill_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    out = tokens[:, 1:]
    return (out, torch.stack(all_logits, dim=1)) if return_logits else out
