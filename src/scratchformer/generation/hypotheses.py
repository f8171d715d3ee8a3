"""The bookkeeping every search shares, written once: a finished :class:`Hypothesis`, its
length-normalised score, a sentence's :class:`Finished` hypotheses (the k best kept), the stop rule
and the n best (the shape of Hugging Face's ``BeamHypotheses`` and fairseq's ``finalize_hypos``).

The readable :func:`~scratchformer.generation.beam_search` keeps one sentence's beams as Python
floats, :func:`~scratchformer.generation.fast_beam.fast_beam_search` as tensors; both rank, stop and
report through these, and :func:`~scratchformer.generation.generate` scores greedy and sampled
outputs with :func:`normalised`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from torch import Tensor

__all__ = ["Finished", "Hypothesis", "check_n_best", "normalised", "out_of_reach"]

Score = TypeVar("Score", float, Tensor)


@dataclass
class Hypothesis:
    """A finished output: the tokens (ending with EOS, without BOS), the model's summed
    log-probability of them, and the length-normalised score that ranks it,
    ``log_prob / len(tokens) ** length_penalty`` with the log-probabilities as the step rules left
    them (they differ from the model's only under a repetition penalty)."""

    tokens: list[int]
    log_prob: float
    score: float


def normalised(total: Score, length: int, length_penalty: float) -> Score:
    """A summed log-probability over ``length`` tokens, ranked: ``total / length ** length_penalty``
    (fairseq's length penalty; 0: the raw sum, larger favours longer output). A float, or a tensor
    of them."""
    return total / length**length_penalty


def out_of_reach(best_live: Score, length: int, length_penalty: float, worst: Score) -> bool | Tensor:
    """The stop rule (Hugging Face's): a sentence is done when its best live hypothesis, summed
    ``best_live`` over ``length`` tokens and normalised at that length, scores no better than
    ``worst``, its k-th best finished one (-inf until it has k). Stopping at the first k finished,
    as fairseq does, can lock in short junk from an undertrained model. Floats, or tensors (one
    sentence a row)."""
    return normalised(best_live, length, length_penalty) <= worst


def check_n_best(n_best: int, beam_size: int) -> None:
    """A beam search returns 1 to ``beam_size`` hypotheses per sentence."""
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"need 1 <= n_best <= beam_size, got n_best={n_best}, beam_size={beam_size}")


class Finished:
    """One sentence's finished hypotheses: every one that ended, the k best once there are k."""

    def __init__(self, k: int, length_penalty: float):
        self.k, self.length_penalty = k, length_penalty
        self.hyps: list[Hypothesis] = []

    def add(self, tokens: list[int], log_prob: float, total: float) -> None:
        """A hypothesis ended: ``tokens`` (ending with EOS, without BOS), the model's summed
        ``log_prob``, and ``total``, its summed log-probabilities as the rules left them (ranked
        by :func:`normalised`)."""
        self.hyps.append(Hypothesis(tokens, log_prob, normalised(total, len(tokens), self.length_penalty)))

    def prune(self) -> None:
        """After a step's additions: with k or more, keep the k best, best first (ties: the first added)."""
        if len(self.hyps) >= self.k:
            self.hyps.sort(key=lambda h: -h.score)
            del self.hyps[self.k :]

    @property
    def worst(self) -> float:
        """The score a live hypothesis must beat: the k-th best (after :meth:`prune`), -inf until
        there are k."""
        return self.hyps[-1].score if len(self.hyps) >= self.k else float("-inf")

    def best(self, n: int) -> list[Hypothesis]:
        """The n best, best first."""
        return sorted(self.hyps, key=lambda h: -h.score)[:n]
