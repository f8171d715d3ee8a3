"""Autoregressive decoding for encoder-decoder models: the :class:`~scratchformer.Transformer`,
the :class:`~scratchformer.CaptioningTransformer`, anything with their :class:`EncoderDecoder` interface.

Greedy and beam search feed one new token per step and reuse a :class:`~scratchformer.DecoderCache`:
each step costs one position, not the whole prefix again, and the encoder's keys/values for
cross-attention are computed once. ``use_cache=False`` (greedy) recomputes the prefix, for tests
and benchmarks only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from scratchformer.core.decoder import Decoder, DecoderCache

__all__ = ["EncoderDecoder", "Hypothesis", "beam_search", "greedy_decode", "max_decode_length"]


class EncoderDecoder(Protocol):
    """What decoding needs: ``config`` with ``pad_id``, ``tgt_vocab_size`` and ``max_len``; the
    source encoded once; the decoder fed new tokens with a cache."""

    config: Any
    decoder: Decoder
    training: bool

    def source_padding_mask(self, src: Tensor) -> Tensor | None: ...

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor: ...

    def decode(self, tgt: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None, *,
               cache: DecoderCache | None = None) -> Tensor: ...


def max_decode_length(model: EncoderDecoder, src_len: int, max_len_a: float, max_len_b: int) -> int:
    """New tokens allowed for a source of ``src_len``: a * S + b (fairseq), within the model's max_len."""
    return max(1, min(int(max_len_a * src_len + max_len_b), model.config.max_len - 1))


def _start(
    model: EncoderDecoder, src: Tensor, bos_id: int, eos_id: int, src_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Check the ids, encode the source once: (memory, source mask, ids never to generate)."""
    if eos_id == model.config.pad_id:
        raise ValueError(f"eos_id={eos_id} equals the model's pad_id: padding is never generated, so EOS could not be")
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= token < model.config.tgt_vocab_size:
            raise ValueError(f"{name}={token} is outside the target vocabulary [0, {model.config.tgt_vocab_size})")
    if model.training:
        warnings.warn("decoding: the model is in training mode (dropout on); call model.eval() first", stacklevel=3)
    if src_padding_mask is None:
        src_padding_mask = model.source_padding_mask(src)
    memory = model.encode(src, src_padding_mask)
    # Never generate padding or a second BOS (fairseq does the same).
    never = torch.tensor([bos_id] + ([model.config.pad_id] if model.config.pad_id is not None else []), device=src.device)
    return memory, src_padding_mask, never


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
    memory, src_padding_mask, never = _start(model, src, bos_id, eos_id, src_padding_mask)
    B = src.shape[0]
    fill_id = model.config.pad_id if model.config.pad_id is not None else eos_id
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)
    cache = model.decoder.new_cache() if use_cache else None
    all_logits = []
    steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
    for step in range(steps):
        if cache is not None:
            logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1]
        else:
            logits = model.decode(tokens, memory, src_padding_mask)[:, -1]
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


@dataclass
class Hypothesis:
    """A finished beam: the tokens (ending with EOS, without BOS), the summed log-probability,
    and the length-normalised score that ranks it, ``log_prob / len(tokens) ** length_penalty``."""

    tokens: list[int]
    log_prob: float
    score: float


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    src_padding_mask: Tensor | None = None,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    n_best: int = 1,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences, with the key/value cache (as fairseq's).

    Each sentence keeps ``beam_size`` live hypotheses. At each step the 2k best extensions are
    ranked; an extension ending in EOS among the top k becomes a finished hypothesis (and stops
    growing), the best k others stay live. Finished hypotheses are ranked by
    ``log_prob / length ** length_penalty`` (fairseq's length penalty; 0 = raw log-probability,
    larger favours longer output). A sentence is done when it has ``beam_size`` finished
    hypotheses and its best live one, normalised at the current length, scores no better than the
    worst of them (Hugging Face's rule; stopping at the first k finished, as fairseq does, can
    lock in short junk from an undertrained model). At the length limit (``a * S + b`` new
    tokens) every live hypothesis is ended with EOS. With ``beam_size=1`` this is greedy search.

    Args:
        src: (B, S) source token ids.
        Other arguments as :func:`greedy_decode`.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"need 1 <= n_best <= beam_size, got n_best={n_best}, beam_size={beam_size}")
    memory, src_padding_mask, never = _start(model, src, bos_id, eos_id, src_padding_mask)
    B, k, device = src.shape[0], beam_size, src.device
    rows = torch.arange(B, device=device).repeat_interleave(k)  # (B*k,) the sentence of each beam
    memory = memory[rows]
    src_padding_mask = None if src_padding_mask is None else src_padding_mask[rows]
    cache = model.decoder.new_cache()
    tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam at the start, or the k beams would all be the same
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
    for step in range(steps):
        logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1].float()
        log_probs = torch.log_softmax(logits, dim=-1).index_fill(1, never, float("-inf"))  # (B*k, V)
        if step == steps - 1:  # the length limit: every live hypothesis ends here
            eos_column = log_probs[:, eos_id].clone()
            log_probs.fill_(float("-inf"))
            log_probs[:, eos_id] = eos_column
        V = log_probs.shape[-1]
        candidates = (scores.view(-1, 1) + log_probs).view(B, k * V)
        best, top_index = candidates.topk(min(2 * k, k * V), dim=1)  # (B, 2k)
        top_scores, top_beam, top_token = best.tolist(), (top_index // V).tolist(), (top_index % V).tolist()

        keep_beam = torch.zeros(B, k, dtype=torch.long)
        keep_token = torch.full((B, k), eos_id, dtype=torch.long)
        new_scores = torch.full((B, k), float("-inf"))
        for b in range(B):
            if done[b]:
                continue
            live = 0
            for rank, (score, beam, token) in enumerate(zip(top_scores[b], top_beam[b], top_token[b])):
                if score == float("-inf") or live == k:
                    break
                if token == eos_id:
                    if rank < k:  # only EOS among the k best extensions ends a hypothesis
                        hyp = tokens[b * k + beam, 1:].tolist() + [eos_id]
                        finished[b].append(Hypothesis(hyp, score, score / len(hyp) ** length_penalty))
                    continue
                keep_beam[b, live], keep_token[b, live], new_scores[b, live] = beam, token, score
                live += 1
            done[b] = live == 0
            if len(finished[b]) >= k:  # stop when no live hypothesis can beat the k finished ones
                finished[b].sort(key=lambda h: -h.score)
                del finished[b][k:]
                best_live = float(new_scores[b, 0]) / (step + 1) ** length_penalty
                done[b] = done[b] or best_live <= finished[b][-1].score
        if all(done):
            break
        index = (torch.arange(B)[:, None] * k + keep_beam).view(-1).to(device)
        cache.reorder(index)
        tokens = torch.cat([tokens[index], keep_token.view(-1, 1).to(device)], dim=1)
        scores = new_scores.to(device)
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]
