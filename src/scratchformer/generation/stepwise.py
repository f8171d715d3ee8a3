"""Token by token for every row at once: greedy search (the best token) or sampling (a token drawn
from the warped distribution), with the key/value cache and the :class:`StepRules`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder, check_logits, start_decoding
from scratchformer.generation.rules import StepRules

__all__ = ["decode_stepwise", "draw", "warp"]


def warp(scores: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Sampling's reshaping of next-token scores (N, V), in Hugging Face's order: divide by the
    temperature; keep the top_k best (ties at the k-th kept); keep the smallest set of best tokens
    whose probability reaches top_p (at least one). The rest become -inf."""
    if temperature != 1.0:
        scores = scores / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = scores.sort(dim=-1)
        tail = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # the least likely tokens, mass <= 1 - p
        tail[:, -1] = False
        scores = scores.masked_fill(tail.scatter(1, order, tail), float("-inf"))
    return scores


def draw(scores: Tensor, generators: Sequence[torch.Generator] | torch.Generator | None) -> Tensor:
    """One token per row from softmax(scores); a list of generators: one per row, so a row draws the
    same numbers in any batch."""
    probs = scores.softmax(dim=-1)
    if isinstance(generators, Sequence):
        return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
    return torch.multinomial(probs, 1, generator=generators)[:, 0]


@torch.no_grad()
def decode_stepwise(
    model: EncoderDecoder,
    src: Tensor,
    rules: StepRules,
    *,
    src_padding_mask: Tensor | None = None,
    generators: Sequence[torch.Generator] | torch.Generator | None = None,
    use_cache: bool = True,
    return_logits: bool = False,
    on_step: Callable[[Tensor], None] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Greedy search or sampling (``rules.config.do_sample``), one token per step for every row.

    Row ``i * n + j`` is sample j of source i (n = ``rules.config.num_return_sequences``).
    ``on_step``: called after each step with its tokens (N,) (a finished row's: the pad id), for
    streaming.

    Returns:
        tokens (B * n, L) without the BOS, each row ending with EOS then pad (or EOS without a
        pad_id); the summed log-probabilities (B * n,) of the model's softmax for the emitted
        tokens (prefix and EOS included); the (B * n, L, V) logits if asked.
    """
    config = rules.config
    bos, eos, n = config.decoder_start_token_id, config.eos_token_id, config.num_return_sequences
    memory, src_padding_mask, cache = start_decoding(model, src, bos, eos, src_padding_mask)
    if n > 1:
        memory = memory.repeat_interleave(n, dim=0)
        src_padding_mask = None if src_padding_mask is None else src_padding_mask.repeat_interleave(n, dim=0)
    N, device = memory.shape[0], memory.device
    rows = torch.arange(src.shape[0], device=device).repeat_interleave(n)
    fill_id = model.config.pad_id if model.config.pad_id is not None else eos
    tokens = torch.full((N, 1), bos, dtype=torch.long, device=device)
    finished = torch.zeros(N, dtype=torch.bool, device=device)
    log_prob = torch.zeros(N, device=device)
    all_logits = []
    for step in range(rules.steps):
        if use_cache:
            logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1]
        else:
            logits = model.decode(tokens, memory, src_padding_mask)[:, -1]
        check_logits(logits, step)
        all_logits.append(logits)
        scores = rules(logits.float(), tokens, step, rows)
        if config.do_sample:
            next_token = draw(warp(scores, config.temperature, config.top_k, config.top_p), generators)
        else:
            next_token = scores.argmax(dim=-1)
        chosen = torch.log_softmax(logits.float(), dim=-1).gather(1, next_token[:, None])[:, 0]
        log_prob += chosen.masked_fill(finished, 0.0)
        next_token = next_token.masked_fill(finished, fill_id)
        if on_step is not None:
            on_step(next_token)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos
        if bool(finished.all()):
            break
    return tokens[:, 1:], log_prob, torch.stack(all_logits, dim=1) if return_logits else None
