"""Scoring a finished output as beam search ranks it, and comparing two engines' outputs "up to ties".

Two correct beam searches can still return different outputs for a sentence: when two hypotheses
score the same up to rounding, the kernels of one CPU (or one engine) may rank them one way and
another's the other way. So a parity check between engines counts a differing line as identical
only when *our* model scores both outputs within ``tolerance`` of each other, in the beam's own
ranking score (:func:`sequence_score`); any other difference is a real one::

    report = same_up_to_ties(model, sources, ours, theirs, bos_id=1, eos_id=2, length_penalty=1.0)
    assert report.ok, report.describe()   # which lines differed, and their two scores
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from scratchformer.generation.interface import EncoderDecoder

__all__ = ["TIE_TOLERANCE", "Difference", "TieReport", "same_up_to_ties", "sequence_score", "sequence_scores"]

TIE_TOLERANCE = 1e-4
"""The default: 1e-4 in length-normalised log-probability. Rounding moves a score by about 1e-6
(fp32 over a few hundred operations; ours against CTranslate2's or transformers' kernels, or
AVX2's against AVX-512's); a real difference of one token in a sentence of 20 moves it by
(log-probability gap) / 20, far above 1e-4 for anything but a near tie."""


def _padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """(B, L) right-padded ids."""
    longest = max(len(r) for r in rows)
    out = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device)


@torch.no_grad()
def sequence_scores(
    model: EncoderDecoder,
    sources: Tensor | Sequence[Sequence[int]],
    hypotheses: Sequence[Sequence[int]],
    *,
    bos_id: int,
    length_penalty: float = 1.0,
    src_padding_mask: Tensor | None = None,
    batch_size: int = 64,
) -> list[float]:
    """The model's length-normalised log-probability of each hypothesis, teacher-forced:
    ``sum_t log p(y_t | y_<t, x) / len(y) ** length_penalty``, the score by which
    :func:`~scratchformer.generation.beam_search` ranks a finished hypothesis (its
    :attr:`Hypothesis.score`, under the plain rules: the rules that only forbid tokens, or force
    EOS with the model's own log p(EOS), leave the other tokens' log-probabilities as they are).

    Args:
        sources: (B, S) source ids (a tensor; right-padded with the model's pad id; a captioner's
            (B, ...) inputs), or B lists of ids.
        hypotheses: B token lists, as :attr:`Hypothesis.tokens`: without BOS, ending with EOS
            (what is given is scored: leave EOS out and its log-probability is left out).
        bos_id: the decoder's first token.
        src_padding_mask: (B, S), True at real tokens; default: the model's own from ``sources``.
    """
    if len(hypotheses) != len(sources):
        raise ValueError(f"expected one hypothesis per source, got {len(hypotheses)} for {len(sources)}")
    if any(len(h) == 0 for h in hypotheses):
        raise ValueError("hypotheses: an empty hypothesis has no score (expected at least EOS)")
    pad_id = model.config.pad_id if model.config.pad_id is not None else 0
    params = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
    device = next(params, torch.empty(0)).device
    src = sources if isinstance(sources, Tensor) else _padded(sources, pad_id, device)
    scores: list[float] = []
    for start in range(0, len(hypotheses), batch_size):
        rows = [list(h) for h in hypotheses[start : start + batch_size]]
        part = src[start : start + batch_size]
        mask = None if src_padding_mask is None else src_padding_mask[start : start + batch_size]
        mask = model.source_padding_mask(part) if mask is None else mask
        memory = model.encode(part, mask)
        tgt = _padded([[bos_id, *h[:-1]] for h in rows], pad_id, device)
        log_probs = torch.log_softmax(model.decode(tgt, memory, mask).double(), dim=-1)  # (B, T, V)
        wanted = _padded(rows, pad_id, device)  # (B, T) the token read at each position
        picked = log_probs.gather(2, wanted.unsqueeze(-1)).squeeze(-1)  # (B, T)
        lengths = torch.tensor([len(h) for h in rows], device=device)
        real = torch.arange(tgt.shape[1], device=device)[None, :] < lengths[:, None]
        total = picked.masked_fill(~real, 0.0).sum(dim=1)
        scores += (total / lengths.double() ** length_penalty).tolist()
    return scores


def sequence_score(
    model: EncoderDecoder,
    source: Sequence[int],
    hypothesis: Sequence[int],
    *,
    bos_id: int,
    length_penalty: float = 1.0,
) -> float:
    """One hypothesis's score (:func:`sequence_scores` of one source)."""
    return sequence_scores(model, [source], [hypothesis], bos_id=bos_id, length_penalty=length_penalty)[0]


@dataclass
class Difference:
    """A line whose two outputs differ, with our model's score of each."""

    line: int
    ours: list[int]
    theirs: list[int]
    ours_score: float
    theirs_score: float

    @property
    def gap(self) -> float:
        return abs(self.ours_score - self.theirs_score)


@dataclass
class TieReport:
    """Two engines' outputs for ``lines`` sentences: ``tied`` lines differ but score within
    ``tolerance`` (the same up to a tie), ``different`` lines differ beyond it; the rest are identical."""

    lines: int
    tolerance: float
    tied: list[Difference] = field(default_factory=list)
    different: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return self.lines - len(self.tied) - len(self.different)

    @property
    def ok(self) -> bool:
        """Every line identical, or tied within the tolerance."""
        return not self.different

    @property
    def share(self) -> float:
        """The share of lines identical or tied (1.0 for no lines)."""
        return 1.0 - len(self.different) / self.lines if self.lines else 1.0

    def describe(self, show: Callable[[list[int]], str] = str, limit: int = 10) -> str:
        """A summary line, then each differing line (up to ``limit``, real differences first) with its
        two outputs (``show``: ids -> text) and our model's score of each."""
        out = [
            f"{self.identical} of {self.lines} lines identical, {len(self.tied)} tied within "
            f"{self.tolerance:g} (our model's length-normalised log-probability), "
            f"{len(self.different)} different"
        ]
        for kind, diffs in (("DIFFERENT", self.different), ("tied", self.tied)):
            for d in diffs[:limit]:
                out.append(
                    f"  line {d.line} ({kind}, gap {d.gap:.2e}):\n"
                    f"    ours   {d.ours_score:.6f}  {show(d.ours)!r}\n"
                    f"    theirs {d.theirs_score:.6f}  {show(d.theirs)!r}"
                )
            limit = max(0, limit - len(diffs))
        return "\n".join(out)

    def __str__(self) -> str:
        return self.describe()


def same_up_to_ties(
    model: EncoderDecoder,
    sources: Tensor | Sequence[Sequence[int]],
    ours: Sequence[Sequence[int]],
    theirs: Sequence[Sequence[int]],
    *,
    bos_id: int,
    length_penalty: float = 1.0,
    tolerance: float = TIE_TOLERANCE,
    src_padding_mask: Tensor | None = None,
) -> TieReport:
    """Compare two engines' best hypotheses line by line: identical, or different outputs that
    ``model`` scores within ``tolerance`` of each other (:func:`sequence_scores`, the beam's
    ranking score with this ``length_penalty``: a tie the engines' rounding broke two ways), or a
    real difference. Hypotheses as :attr:`Hypothesis.tokens` (ending with EOS, without BOS)."""
    if not len(ours) == len(theirs) == len(sources):
        raise ValueError(
            f"expected as many outputs as sources, got {len(ours)} and {len(theirs)} for {len(sources)}"
        )
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if list(a) != list(b)]
    report = TieReport(len(ours), tolerance)
    if not differ:
        return report
    if isinstance(sources, Tensor):
        src: Tensor | list[list[int]] = sources[differ]
        mask = None if src_padding_mask is None else src_padding_mask[differ]
    else:
        src, mask = [list(sources[i]) for i in differ], None
    pairs = [list(ours[i]) for i in differ] + [list(theirs[i]) for i in differ]
    both = torch.cat([src, src]) if isinstance(src, Tensor) else src + src
    mask = None if mask is None else torch.cat([mask, mask])
    scores = sequence_scores(
        model, both, pairs, bos_id=bos_id, length_penalty=length_penalty, src_padding_mask=mask
    )
    for j, i in enumerate(differ):
        d = Difference(i, list(ours[i]), list(theirs[i]), scores[j], scores[len(differ) + j])
        (report.tied if d.gap <= tolerance else report.different).append(d)
    return report
