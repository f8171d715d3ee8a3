"""Beam search that does only the work it must: the search of :func:`~scratchformer.generation.beam_search`
(generation/beam.py, the readable reference), tested equal to it in tests/generation/test_fast_beam.py.

What the reference does and this does not (read in CTranslate2's ``decoding.cc`` and fairseq's
``sequence_generator.py``):

- replicate the encoder's keys/values across the beams: each layer keeps the memory's keys/values
  once per sentence and a sentence's k beams are k queries of one attention ("beamable" matmul,
  fairseq's and CTranslate2's);
- run the first step k times: it runs at batch B (one beam per sentence), then fans out to k;
- decode finished sentences: they leave the batch (fairseq's ``batch_idxs``, CTranslate2's
  ``keep_batches``);
- grow and copy whole cache buffers: the self-attention cache is allocated once at its final
  length, and only its filled part is reordered;
- rank all k x V extensions of a sentence: each beam's 2k best tokens first, then the 2k best of
  those k x 2k (a sentence's 2k best extensions are among its beams' 2k best tokens);
- loop over beams in Python: the step's bookkeeping is tensor operations; Python touches only the
  hypotheses that end;
- run the model's ``decode`` for a step: :class:`~scratchformer.generation.fast_step.DecoderStep`
  computes the same layers with the fewest operations a step can take (generation/fast_step.py).

It applies every decoding rule of :class:`~scratchformer.generation.StepRules` (a forced prefix,
the repetition penalty, banned n-grams, a minimum length, never BOS or pad, EOS at the length
limit) in its candidate step, to the log-probabilities of the live rows before their 2k best are
taken (as CTranslate2's ``decoding.cc`` and fairseq do). It runs the reference for a model it
cannot step (:func:`reference_reason` says which and why: an ensemble, a model in training mode,
decoder layers other than :class:`DecoderLayer`), and within :func:`readable_beam_search`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.decoder import DecoderLayer
from scratchformer.generation.beam import beam_search
from scratchformer.generation.ensemble import Ensemble
from scratchformer.generation.fast_step import DecoderStep
from scratchformer.generation.hypotheses import Finished, Hypothesis, check_n_best, out_of_reach
from scratchformer.generation.interface import EncoderDecoder, check_logits, start_decoding, target_embedding
from scratchformer.generation.rules import StepRules, default_rules

__all__ = ["fast_beam_search", "readable_beam_search", "reference_reason"]

_READABLE: ContextVar[bool] = ContextVar("readable_beam_search", default=False)


@contextmanager
def readable_beam_search() -> Iterator[None]:
    """Within the block, :func:`fast_beam_search` (and so ``generate`` and every task) runs the
    readable reference ``beam_search``: to compare or time the two on the same code path
    (benchmarks/serving.py, scripts/parity/fast_beam_parity.py)."""
    token = _READABLE.set(True)
    try:
        yield
    finally:
        _READABLE.reset(token)


def reference_reason(model: EncoderDecoder) -> str | None:
    """Why :func:`fast_beam_search` (and so ``generate``) decodes ``model`` by the readable
    reference ``beam_search``, or None when it decodes it itself: the one place that decides it.
    Every decoding rule runs fast; what does not is a model the fast step cannot compute."""
    if _READABLE.get():
        return "within readable_beam_search()"
    if isinstance(model, Ensemble):
        return "an Ensemble: its step averages several decoders' log-probabilities, the fast step runs one"
    if model.training:
        return "the model is in training mode (dropout on): the fast step computes eval mode"
    layers = model.decoder.layers
    if not len(layers) or not all(isinstance(layer, DecoderLayer) for layer in layers):
        return "the fast step computes a stack of DecoderLayer modules, and the model's decoder is not one"
    if target_embedding(model) is None:
        return f"{type(model).__name__} has no embed_target: the fast step embeds the target itself"
    return None


class BeamState:
    """The bookkeeping: the live sentences, their beams' scores, the finished hypotheses (also
    continuous batching's, :mod:`~scratchformer.generation.continuous`)."""

    def __init__(self, B: int, k: int, rules: StepRules, length_penalty: float, device: torch.device):
        self.k, self.rules, self.eos, self.length_penalty = k, rules, rules.eos, length_penalty
        self.sentence = torch.arange(B, device=device)  # (Bs,) the number of each live sentence
        self.scores = torch.zeros(B, 1, device=device)  # (Bs, beams) each beam's summed ranking score
        # the model's summed log-probabilities where the rules' ranking differs (a repetition penalty)
        self.log_prob = torch.zeros(B, 1, device=device) if rules.reranks else None
        self.finished = [Finished(k, length_penalty) for _ in range(B)]
        # the k-th best finished score of each sentence (-inf until it has k), in float64: compared
        # as the reference compares Python floats
        self.worst = torch.full((B,), float("-inf"), dtype=torch.float64, device=device)

    def _candidates(
        self, logits: Tensor, tokens: Tensor, step: int | Tensor, beams: int
    ) -> tuple[Tensor, ...]:
        """Each row's 2k best next tokens under the rules, from logits (N, V) after tokens (N, step +
        1) (NaN: an error; ``step`` (Bs,): each sentence's own, its tokens left-padded): their
        scores, the tokens, and (under a repetition penalty) the model's log-probabilities of them,
        (N, c) each."""
        log_probs = torch.log_softmax(logits, dim=-1)  # one fused pass: faster than topk + logsumexp
        rows = self.sentence if beams == 1 else self.sentence.repeat_interleave(beams)
        at = step if isinstance(step, int) or beams == 1 else step.repeat_interleave(beams)
        reranks = self.log_prob is not None  # then the model's log-probabilities are read below
        ranked = self.rules(log_probs, tokens, at, rows, inplace=not reranks)
        values, token = ranked.topk(min(2 * self.k, logits.shape[-1]), dim=-1)
        check_logits(values, step if isinstance(step, int) else int(step.max()))  # NaN logit: NaN row
        return values, token, log_probs.gather(1, token) if reranks else values

    def _extensions(
        self, logits: Tensor, tokens: Tensor, step: int | Tensor, beams: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The 2k best extensions of each live sentence's beams, best first: (score, beam, token, the
        model's summed log-probability), (Bs, 2k) each."""
        values, candidates, model = self._candidates(logits, tokens, step, beams)
        c = values.shape[1]
        total = (self.scores.reshape(-1, 1) + values).view(-1, beams * c)
        best, position = total.topk(min(2 * self.k, beams * c), dim=1)
        beam, token = position // c, candidates.view(-1, beams * c).gather(1, position)
        log_prob = best
        if self.log_prob is not None:
            log_prob = (self.log_prob.reshape(-1, 1) + model).view(-1, beams * c).gather(1, position)
        if best.shape[1] < self.k:  # fewer candidates than beams (a vocabulary smaller than k)
            pad = (0, self.k - best.shape[1])
            best, beam, token = F.pad(best, pad, value=float("-inf")), F.pad(beam, pad), F.pad(token, pad)
            log_prob = F.pad(log_prob, pad, value=float("-inf"))
        return best, beam, token, log_prob

    def _finish(
        self, ended: Tensor, best: Tensor, log_prob: Tensor, beam: Tensor, tokens: Tensor, step: int | Tensor
    ) -> None:
        """The extensions ``ended`` (Bs, 2k) by EOS join their sentences' finished hypotheses:
        each row's last ``step`` tokens (after BOS), then EOS."""
        s, j = ended.nonzero(as_tuple=True)
        beams = tokens.shape[0] // ended.shape[0]
        ids = tokens[s * beams + beam[s, j]].tolist()
        lengths = [step] * len(ids) if isinstance(step, int) else step[s].tolist()
        touched = set()
        for b, row, n, total, lp in zip(
            self.sentence[s].tolist(), ids, lengths, best[s, j].tolist(), log_prob[s, j].tolist()
        ):
            self.finished[b].add(row[len(row) - n :] + [self.eos], lp, total)
            touched.add(b)
        for b in touched:
            self.finished[b].prune()
            self.worst[b] = self.finished[b].worst

    def advance(
        self, logits: Tensor, tokens: Tensor, step: int | Tensor, beams: int
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """One step of every live sentence from logits (Bs * beams, V) after tokens (Bs * beams,
        step + 1) (``step`` (Bs,): each sentence's own, its tokens left-padded). Returns the rows
        the next beams extend (N',), their new tokens (N',) and the live sentences kept, by
        position (None: all); (None, None, None) when every one is done."""
        best, beam, token, log_prob = self._extensions(logits, tokens, step, beams)
        k, width = self.k, best.shape[1]
        rank = torch.arange(width, device=best.device)
        valid, is_eos = best > float("-inf"), token == self.eos
        if bool((ended := is_eos & valid & (rank < k)).any()):  # only EOS among the k best ends a beam
            self._finish(ended, best, log_prob, beam, tokens, step)
        extend = ~is_eos & valid  # the k best of these, in rank order, stay live
        order = torch.where(extend, rank, rank + width).argsort(dim=1)[:, :k]
        kept = extend.gather(1, order)
        scores = torch.where(kept, best.gather(1, order), float("-inf"))
        beam = torch.where(kept, beam.gather(1, order), 0)
        token = torch.where(kept, token.gather(1, order), self.eos)
        live = scores[:, 0].double()
        length = step + 1 if isinstance(step, int) else (step + 1).double()
        done = ~kept[:, 0] | out_of_reach(live, length, self.length_penalty, self.worst[self.sentence])
        if bool(done.all()):
            return None, None, None
        rows = torch.arange(len(best), device=best.device)[:, None] * beams + beam  # (Bs, k)
        log_prob = None if self.log_prob is None else log_prob.gather(1, order)
        sentences = None
        if bool(done.any()):  # finished sentences leave the batch
            sentences = (~done).nonzero()[:, 0]
            rows, token, scores = rows[sentences], token[sentences], scores[sentences]
            log_prob = None if log_prob is None else log_prob[sentences]
            self.sentence = self.sentence[sentences]
        self.scores, self.log_prob = scores, log_prob
        return rows.reshape(-1), token.reshape(-1), sentences


@torch.no_grad()
def fast_beam_search(
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
    """:func:`~scratchformer.generation.beam_search` (same arguments, same hypotheses up to ties
    of rounding), doing only the work it must (module docstring), under every rule. src (B, S).
    Where :func:`reference_reason` gives a reason, it runs the reference."""
    if reference_reason(model) is not None:
        return beam_search(
            model, src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, length_penalty=length_penalty,
            src_padding_mask=src_padding_mask, max_len_a=max_len_a, max_len_b=max_len_b, n_best=n_best,
            rules=rules,
        )  # fmt: skip
    check_n_best(n_best, beam_size)
    memory, src_padding_mask, _ = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    B, k, device = src.shape[0], beam_size, src.device
    rules = default_rules(model, src, bos_id, eos_id, max_len_a, max_len_b) if rules is None else rules
    decoder = DecoderStep(model, memory, src_padding_mask, B * k, rules.steps)
    search = BeamState(B, k, rules, length_penalty, device)
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    beams = 1  # the first step: one beam per sentence
    for step in range(rules.steps):
        logits = decoder(tokens[:, -1:], step, beams)
        rows, token, kept = search.advance(logits, tokens, step, beams)
        if rows is None:
            break
        decoder.keep(rows, kept, step + 1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        beams = k
    return [hyps.best(n_best) for hyps in search.finished]
