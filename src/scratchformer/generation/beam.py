"""Beam search with the key/value cache, as fairseq's and Hugging Face's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder, check_logits, max_decode_length, start_decoding
from scratchformer.generation.rules import StepRules

__all__ = ["Hypothesis", "beam_search"]


@dataclass
class Hypothesis:
    """A finished beam: the tokens (ending with EOS, without BOS), the model's summed
    log-probability of them, and the length-normalised score that ranks it,
    ``log_prob / len(tokens) ** length_penalty`` with the log-probabilities as the step rules left
    them (they differ from the model's only under a repetition penalty)."""

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
    rules: StepRules | None = None,
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
        rules: what may come next (:class:`StepRules`: prefix, n-gram and repetition rules, minimum
            and maximum length), applied to the log-probabilities (as Hugging Face's processors);
            default: never BOS or pad, EOS at ``a * S + b`` new tokens.
        model, bos_id, eos_id, src_padding_mask, max_len_a, max_len_b: as in :func:`greedy_decode`.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"need 1 <= n_best <= beam_size, got n_best={n_best}, beam_size={beam_size}")
    memory, src_padding_mask, cache = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    if rules is None:
        rules = StepRules.plain(bos_id, eos_id, model.config.pad_id, src.shape[0],
                                max_decode_length(model, src.shape[1], max_len_a, max_len_b), src.device)
    B, k, device = src.shape[0], beam_size, src.device
    rows = torch.arange(B, device=device).repeat_interleave(k)  # (B*k,) the sentence of each beam
    memory = memory[rows]
    src_padding_mask = None if src_padding_mask is None else src_padding_mask[rows]
    tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam at the start, or the k beams would all be the same
    log_prob = torch.zeros(B * k, device=device)  # the model's own, before the rules: reported
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    for step in range(rules.steps):
        logits = model.decode(tokens[:, -1:], memory, src_padding_mask, cache=cache)[:, -1].float()
        check_logits(logits, step)
        model_log_probs = torch.log_softmax(logits, dim=-1)
        log_probs = rules(model_log_probs, tokens, step, rows)  # (B*k, V)
        V = log_probs.shape[-1]
        candidates = (scores.view(-1, 1) + log_probs).view(B, k * V)
        best, top_index = candidates.topk(min(2 * k, k * V), dim=1)  # (B, 2k)
        top_scores, top_beam, top_token = best.tolist(), (top_index // V).tolist(), (top_index % V).tolist()
        top_log_probs = (log_prob.view(-1, 1) + model_log_probs).view(B, k * V).gather(1, top_index).tolist()

        keep_beam = torch.zeros(B, k, dtype=torch.long)
        keep_token = torch.full((B, k), eos_id, dtype=torch.long)
        new_scores, new_log_prob = torch.full((B, k), float("-inf")), torch.zeros(B, k)
        for b in range(B):
            if done[b]:
                continue
            live = 0
            for rank, (score, beam, token, lp) in enumerate(zip(top_scores[b], top_beam[b], top_token[b],
                                                                top_log_probs[b])):
                if score == float("-inf") or live == k:
                    break
                if token == eos_id:
                    if rank < k:  # only EOS among the k best extensions ends a hypothesis
                        hyp = tokens[b * k + beam, 1:].tolist() + [eos_id]
                        finished[b].append(Hypothesis(hyp, lp, score / len(hyp) ** length_penalty))
                    continue
                keep_beam[b, live], keep_token[b, live], new_scores[b, live] = beam, token, score
                new_log_prob[b, live] = lp
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
        scores, log_prob = new_scores.to(device), new_log_prob.view(-1).to(device)
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]
