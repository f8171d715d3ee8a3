"""Beam search with the key/value cache, as fairseq's and Hugging Face's."""

from __future__ import annotations

import torch
from torch import Tensor

from scratchformer.generation.hypotheses import Finished, Hypothesis, check_n_best, out_of_reach
from scratchformer.generation.interface import EncoderDecoder, check_logits, start_decoding
from scratchformer.generation.rules import StepRules, default_rules

__all__ = ["Hypothesis", "beam_search"]


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
    rules: StepRules | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences, with the key/value cache (as fairseq's).

    Each sentence keeps ``beam_size`` live hypotheses. At each step the 2k best extensions are
    ranked; an extension ending in EOS among the top k becomes a finished hypothesis (and stops
    growing), the best k others stay live. Finished hypotheses are ranked by
    ``log_prob / length ** length_penalty`` (:func:`~scratchformer.generation.hypotheses.normalised`).
    A sentence is done when it has ``beam_size`` finished hypotheses none of its live ones can beat
    (:func:`~scratchformer.generation.hypotheses.out_of_reach`, Hugging Face's rule). At the length
    limit (``a * S + b`` new tokens) every live hypothesis is ended with EOS. With ``beam_size=1``
    this is greedy search.

    Args:
        src: (B, S) source token ids.
        rules: what may come next (:class:`StepRules`: prefix, n-gram and repetition rules, minimum
            and maximum length), applied to the log-probabilities (as Hugging Face's processors);
            default: never BOS or pad, EOS at ``a * S + b`` new tokens.
        model, bos_id, eos_id, src_padding_mask, max_len_a, max_len_b: as in :func:`greedy_decode`.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    check_n_best(n_best, beam_size)
    memory, src_padding_mask, cache = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    rules = default_rules(model, src, bos_id, eos_id, max_len_a, max_len_b) if rules is None else rules
    B, k, device = src.shape[0], beam_size, src.device
    rows = torch.arange(B, device=device).repeat_interleave(k)  # (B*k,) the sentence of each beam
    memory, src_padding_mask = memory[rows], None if src_padding_mask is None else src_padding_mask[rows]
    tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam at the start, or the k beams would all be the same
    log_prob = torch.zeros(B * k, device=device)  # the model's own, before the rules: reported
    finished, done = [Finished(k, length_penalty) for _ in range(B)], [False] * B
    for step in range(rules.steps):
        logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1].float()
        check_logits(logits, step)
        model_log_probs = torch.log_softmax(logits, dim=-1)
        log_probs = rules(model_log_probs, tokens, step, rows)  # (B*k, V)
        ranked = _best_extensions(scores, log_prob, log_probs, model_log_probs, k)
        beam, token, new_scores, new_log_prob = _next_beams(ranked, tokens, finished, done, eos_id, step)
        if all(done):
            break
        index = (torch.arange(B)[:, None] * k + beam).view(-1).to(device)
        cache.reorder(index)  # each kept beam continues from the beam it extends
        tokens = torch.cat([tokens[index], token.view(-1, 1).to(device)], dim=1)
        scores, log_prob = new_scores.to(device), new_log_prob.view(-1).to(device)
    return [hyps.best(n_best) for hyps in finished]


Extension = tuple[
    float, int, int, float
]  # (score, beam, token, the model's log-probability) of a beam + a token


def _best_extensions(
    scores: Tensor, log_prob: Tensor, log_probs: Tensor, model_log_probs: Tensor, k: int
) -> list[list[Extension]]:
    """The 2k best extensions of each sentence's k beams, best first: ``scores`` (B, k) of the beams
    plus the rules' ``log_probs`` (B*k, V) of each next token rank them; ``log_prob`` (B*k,) plus
    ``model_log_probs`` (B*k, V) is what the model gives them (reported)."""
    B, V = scores.shape[0], log_probs.shape[-1]
    candidates = (scores.view(-1, 1) + log_probs).view(B, k * V)
    best, top_index = candidates.topk(min(2 * k, k * V), dim=1)  # (B, 2k)
    top_scores, top_beam, top_token = best.tolist(), (top_index // V).tolist(), (top_index % V).tolist()
    top_log_probs = (log_prob.view(-1, 1) + model_log_probs).view(B, k * V).gather(1, top_index).tolist()
    return [list(zip(*row)) for row in zip(top_scores, top_beam, top_token, top_log_probs)]


def _next_beams(
    ranked: list[list[Extension]],
    tokens: Tensor,
    finished: list[Finished],
    done: list[bool],
    eos_id: int,
    step: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every sentence not yet ``done`` takes its step (:func:`_advance`, which updates ``finished``
    and ``done``). Returns the k beams each sentence keeps, as (B, k) tensors: the beam each extends,
    its new token (EOS in an unused place), its score (-inf there) and its model log-probability."""
    B, k = len(ranked), tokens.shape[0] // len(ranked)
    keep_beam = torch.zeros(B, k, dtype=torch.long)
    keep_token = torch.full((B, k), eos_id, dtype=torch.long)
    new_scores, new_log_prob = torch.full((B, k), float("-inf")), torch.zeros(B, k)
    for b in range(B):
        if done[b]:
            continue
        live, done[b] = _advance(ranked[b], tokens[b * k : (b + 1) * k], finished[b], k, eos_id, step)
        for i, (beam, token, score, lp) in enumerate(live):
            keep_beam[b, i], keep_token[b, i], new_scores[b, i], new_log_prob[b, i] = beam, token, score, lp
    return keep_beam, keep_token, new_scores, new_log_prob


def _advance(
    ranked: list[Extension], beams: Tensor, finished: Finished, k: int, eos_id: int, step: int
) -> tuple[list[tuple[int, int, float, float]], bool]:
    """One sentence's step: its ``ranked`` extensions, best first, of its k ``beams`` (k, t) tokens.
    An extension ending in EOS among the top k joins ``finished``; the best k others stay live.
    Returns the live ones, (beam, token, score, log_prob), and whether the sentence is done: no live
    extension, or k finished hypotheses none of the live ones can beat (:func:`out_of_reach`)."""
    live: list[tuple[int, int, float, float]] = []
    for rank, (score, beam, token, lp) in enumerate(ranked):
        if score == float("-inf") or len(live) == k:
            break
        if token == eos_id:
            if rank < k:  # only EOS among the k best extensions ends a hypothesis
                finished.add(beams[beam, 1:].tolist() + [eos_id], lp, score)
            continue
        live.append((beam, token, score, lp))
    finished.prune()
    return live, not live or out_of_reach(live[0][2], step + 1, finished.length_penalty, finished.worst)
