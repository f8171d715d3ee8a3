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

It applies to the plain rules (never BOS or pad, EOS at the length limit: what translation and
captioning use) on a model in eval mode whose decoder layers are :class:`DecoderLayer` s; for
anything else (a prefix, penalties, banned n-grams, a minimum length) it runs the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.core.decoder import DecoderLayer
from scratchformer.generation.beam import Hypothesis, beam_search
from scratchformer.generation.fast_step import DecoderStep, embedder
from scratchformer.generation.interface import EncoderDecoder, check_logits, max_decode_length, start_decoding
from scratchformer.generation.rules import StepRules

__all__ = ["fast_beam_search", "readable_beam_search", "runs_fast"]

_READABLE: ContextVar[bool] = ContextVar("readable_beam_search", default=False)


@contextmanager
def readable_beam_search() -> Iterator[None]:
    """Within the block, :func:`fast_beam_search` (and so ``generate`` and every task) runs the
    readable reference ``beam_search``: to compare or time the two on the same code path
    (benchmarks/serving.py, scripts/fast_beam_parity.py)."""
    token = _READABLE.set(True)
    try:
        yield
    finally:
        _READABLE.reset(token)


def runs_fast(model: EncoderDecoder, rules: StepRules | None) -> bool:
    """Whether :func:`fast_beam_search` decodes ``model`` under ``rules`` itself (else it runs the
    reference): eval mode, :class:`DecoderLayer` s, a known embedding, the plain rules."""
    plain = rules is None or (
        rules.config.repetition_penalty == 1.0
        and not rules.config.no_repeat_ngram_size
        and not rules.config.min_new_tokens
        and int(rules.prefix_len.max()) == 0
    )
    layers = getattr(getattr(model, "decoder", None), "layers", [])
    return (
        plain
        and not model.training
        and len(layers) > 0
        and all(isinstance(layer, DecoderLayer) for layer in layers)
        and embedder(model) is not None
    )


class _Search:
    """The bookkeeping: the live sentences, their beams' scores, the finished hypotheses."""

    def __init__(
        self, B: int, k: int, eos_id: int, length_penalty: float, never: Tensor, device: torch.device
    ):
        self.k, self.eos, self.length_penalty, self.never = k, eos_id, length_penalty, never
        self.sentence = torch.arange(B, device=device)  # (Bs,) the number of each live sentence
        self.scores = torch.zeros(B, 1, device=device)  # (Bs, beams) each beam's summed log-probability
        self.finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        # the k-th best finished score of each sentence (-inf until it has k), in float64: compared
        # as the reference compares Python floats
        self.worst = torch.full((B,), float("-inf"), dtype=torch.float64, device=device)

    def _extensions(self, logits: Tensor, beams: int, step: int, last: bool) -> tuple[Tensor, Tensor, Tensor]:
        """The 2k best extensions of each live sentence's beams, best first: (score, beam, token),
        (Bs, 2k) each, from logits (Bs * beams, V) (NaN: an error). At the ``last`` step EOS is the
        only token."""
        log_probs = torch.log_softmax(logits, dim=-1)  # one fused pass: faster than topk + logsumexp
        if last:
            values = log_probs[:, self.eos : self.eos + 1]
            tokens = torch.full_like(values, self.eos, dtype=torch.long)
        else:
            values, tokens = log_probs.index_fill_(1, self.never, float("-inf")).topk(
                min(2 * self.k, logits.shape[-1]), dim=-1
            )  # (N, c) each beam's best tokens
        check_logits(values, step)  # a NaN logit makes its row's log-probabilities NaN
        c = values.shape[1]
        total = (self.scores.reshape(-1, 1) + values).view(-1, beams * c)
        best, position = total.topk(min(2 * self.k, beams * c), dim=1)
        beam, token = position // c, tokens.view(-1, beams * c).gather(1, position)
        if best.shape[1] < self.k:  # fewer candidates than beams (a vocabulary smaller than k)
            pad = (0, self.k - best.shape[1])
            best, beam, token = F.pad(best, pad, value=float("-inf")), F.pad(beam, pad), F.pad(token, pad)
        return best, beam, token

    def _finish(self, ended: Tensor, best: Tensor, beam: Tensor, tokens: Tensor, beams: int) -> None:
        """The extensions ``ended`` (Bs, 2k) by EOS join their sentences' finished hypotheses; a
        sentence with k or more keeps its k best."""
        s, j = ended.nonzero(as_tuple=True)
        ids = tokens[s * beams + beam[s, j], 1:].tolist()
        touched = set()
        for b, hyp, score in zip(self.sentence[s].tolist(), ids, best[s, j].tolist()):
            hyp = hyp + [self.eos]
            self.finished[b].append(Hypothesis(hyp, score, score / len(hyp) ** self.length_penalty))
            touched.add(b)
        for b in touched:
            hyps = self.finished[b]
            if len(hyps) >= self.k:
                hyps.sort(key=lambda h: -h.score)
                del hyps[self.k :]
                self.worst[b] = hyps[-1].score

    def advance(
        self, logits: Tensor, tokens: Tensor, step: int, beams: int, last: bool
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """One step of every live sentence from logits (Bs * beams, V) after tokens (Bs * beams,
        step + 1). Returns the rows the next beams extend (N',), their new tokens (N',) and the
        live sentences kept, by position (None: all); (None, None, None) when every one is done."""
        best, beam, token = self._extensions(logits, beams, step, last)
        k, width = self.k, best.shape[1]
        rank = torch.arange(width, device=best.device)
        valid, is_eos = best > float("-inf"), token == self.eos
        if bool((ended := is_eos & valid & (rank < k)).any()):  # only EOS among the k best ends a beam
            self._finish(ended, best, beam, tokens, beams)
        extend = ~is_eos & valid  # the k best of these, in rank order, stay live
        order = torch.where(extend, rank, rank + width).argsort(dim=1)[:, :k]
        kept = extend.gather(1, order)
        scores = torch.where(kept, best.gather(1, order), float("-inf"))
        beam = torch.where(kept, beam.gather(1, order), 0)
        token = torch.where(kept, token.gather(1, order), self.eos)
        best_live = scores[:, 0].double() / (step + 1) ** self.length_penalty
        done = ~kept[:, 0] | (best_live <= self.worst[self.sentence])
        if bool(done.all()):
            return None, None, None
        rows = torch.arange(len(best), device=best.device)[:, None] * beams + beam  # (Bs, k)
        sentences = None
        if bool(done.any()):  # finished sentences leave the batch
            sentences = (~done).nonzero()[:, 0]
            rows, token, scores = rows[sentences], token[sentences], scores[sentences]
            self.sentence = self.sentence[sentences]
        self.scores = scores
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
    of rounding), doing only the work it must (module docstring). src (B, S). Where it does not
    apply (:func:`runs_fast`), or within :func:`readable_beam_search`, it runs the reference."""
    if _READABLE.get() or not runs_fast(model, rules):
        return beam_search(
            model, src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, length_penalty=length_penalty,
            src_padding_mask=src_padding_mask, max_len_a=max_len_a, max_len_b=max_len_b, n_best=n_best,
            rules=rules,
        )  # fmt: skip
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"need 1 <= n_best <= beam_size, got n_best={n_best}, beam_size={beam_size}")
    memory, src_padding_mask, _ = start_decoding(model, src, bos_id, eos_id, src_padding_mask)
    B, k, device = src.shape[0], beam_size, src.device
    if rules is None:
        steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
        rules = StepRules.plain(bos_id, eos_id, model.config.pad_id, B, steps, device)
    decoder = DecoderStep(model, memory, src_padding_mask, B * k, rules.steps)
    search = _Search(B, k, eos_id, length_penalty, rules.never.to(device), device)
    tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    beams = 1  # the first step: one beam per sentence
    for step in range(rules.steps):
        logits = decoder(tokens[:, -1:], step, beams)
        rows, token, kept = search.advance(logits, tokens, step, beams, last=step == rules.steps - 1)
        if rows is None:
            break
        decoder.keep(rows, kept, step + 1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        beams = k
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in search.finished]
