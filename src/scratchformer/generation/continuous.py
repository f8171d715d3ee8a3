"""Continuous (iteration-level) batching: a running search that sentences join at any step and
leave at the step they finish, as TGI and vLLM batch a decoder-only model (Orca, OSDI 2022), here
for an encoder-decoder's beam search, greedy search and sampling::

    search = ContinuousSearch(model, GenerationConfig(num_beams=5))
    search.join(src, tags=["a", "b"])         # src (2, S): encoded now, decoded from the next step
    while search.live:
        for tag, hyps in search.step():       # one step of every live sentence
            ...                               # the sentences that finished at this step
        search.join(more, tags=["c"])         # newcomers start at their own position 0

A sentence that joins is encoded, its memory keys/values join the batch's (padded to the longest
live source, the padding hidden by the additive bias; shortened again when the longest leaves),
and its rows start at their own position: each row embeds its own position, writes its own
position of the self-attention cache and attends to its own past only
(:class:`~scratchformer.generation.fast_step.Positions`). A fresh beam search's first step runs one
beam a sentence, as ``fast_beam_search``'s; a newcomer to a running one enters with k beams of
which one is live (scores 0, -inf, ...): either way its first step is the step it takes alone.

A sentence's output does not depend on what it was decoded with: each sentence has its own rules
(its own length limit ``max_len_a * S + max_len_b`` of its own S, as decoding it alone has), and in
fp32 it gets the tokens it gets alone (up to ties of rounding: padding and batch size change the
order of a few sums). Tested with arrivals at every step of a running batch
(tests/generation/test_continuous.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from scratchformer.generation.config import GenerationConfig
from scratchformer.generation.fast_beam import BeamState, reference_reason
from scratchformer.generation.fast_step import DecoderStep, rows_of
from scratchformer.generation.generate import step_rules
from scratchformer.generation.hypotheses import Finished, Hypothesis, check_n_best, normalised
from scratchformer.generation.interface import EncoderDecoder, check_logits, start_decoding
from scratchformer.generation.rules import StepRules
from scratchformer.generation.stepwise import draw, warp

__all__ = ["ContinuousSearch"]

Tag = Any  # what the caller names a sentence by
OnStep = Callable[[list[Tag], Tensor], None]  # the tag of each row, the tokens (N,) it chose


class _Beams(BeamState):
    """Beam search's bookkeeping (:class:`~scratchformer.generation.fast_beam.BeamState`) for
    sentences that join at any step, and the state of the sentences that leave dropped. A fresh
    search's first step runs one beam a sentence (as ``fast_beam_search``'s); a sentence that joins
    a running one comes with k beams of which one is live."""

    def __init__(self, k: int, rules: StepRules, length_penalty: float, n_best: int, device: torch.device):
        super().__init__(0, k, rules.take(rules.ends[:0]), length_penalty, device)
        self.n_best = n_best

    @property
    def width(self) -> int:
        """Rows per sentence: 1 before the first step, then k."""
        return self.scores.shape[1]

    def join(self, rules: StepRules) -> None:
        """B' sentences join: one live beam each (score 0), and once the search has stepped, k - 1
        that no extension comes from (-inf)."""
        B, device = len(rules.ends), self.scores.device
        first = torch.full((B, self.width), float("-inf"), device=device)
        first[:, 0] = 0.0
        self.sentence = torch.cat([self.sentence, len(self.finished) + torch.arange(B, device=device)])
        self.scores = torch.cat([self.scores, first])
        self.log_prob = None if self.log_prob is None else torch.cat([self.log_prob, first])
        self.finished += [Finished(self.k, self.length_penalty) for _ in range(B)]
        self.worst = torch.cat(
            [self.worst, torch.full((B,), float("-inf"), dtype=torch.float64, device=device)]
        )
        self.rules = self.rules.join(rules)

    def advance_all(
        self, logits: Tensor, tokens: Tensor, step: int | Tensor
    ) -> tuple[Tensor, Tensor, Tensor, dict[int, list[Hypothesis]]]:
        """One step (:meth:`BeamState.advance`) after ``step`` steps (one for all, or (Bs,) each
        sentence's): the rows the next beams extend, their tokens, the sentences kept (by
        position) and the n best of each sentence that ended, by position."""
        Bs = self.scores.shape[0]
        rows, token, kept = self.advance(logits, tokens, step, self.width)
        if rows is None or token is None:
            rows, token, kept = tokens.new_zeros(0), tokens.new_zeros(0), tokens.new_zeros(0)
        elif kept is None:
            kept = torch.arange(Bs, device=tokens.device)
        ended = sorted(set(range(Bs)) - set(kept.tolist()))
        out = {p: self.finished[p].best(self.n_best) for p in ended}
        if ended and len(kept):
            self.take(kept, selected=True)
        return rows, token, kept, out

    def take(self, kept: Tensor, selected: bool = False) -> None:
        """Keep the sentences at positions ``kept`` (``selected``: their scores are kept already)."""
        if not selected:
            self.scores = self.scores[kept]
            self.log_prob = None if self.log_prob is None else self.log_prob[kept]
        index = self.sentence if selected else self.sentence[kept]
        self.finished = [self.finished[i] for i in index.tolist()]
        self.worst, self.rules = self.worst[index], self.rules.take(index)
        self.sentence = torch.arange(len(index), device=index.device)


class _Drawn:
    """Greedy search or sampling (:func:`~scratchformer.generation.stepwise.decode_stepwise`'s
    step) for sentences that join at any step: n rows a sentence (its n samples), which leaves when
    all n have ended; a row that ended feeds the pad id until then."""

    def __init__(
        self, config: GenerationConfig, rules: StepRules, fill_id: int, seed: int | None, device: torch.device
    ):
        self.config, self.n, self.fill_id, self.seed = config, config.num_return_sequences, fill_id, seed
        self.rules = rules.take(rules.ends[:0])
        self.ended = torch.zeros(0, dtype=torch.bool, device=device)  # (N,)
        self.log_prob = torch.zeros(0, device=device)  # (N,)
        self.generators: list[torch.Generator] = []
        self.width = self.n  # rows per sentence
        self.chosen = torch.zeros(0, dtype=torch.long, device=device)  # the last step's tokens (N,)

    def join(self, rules: StepRules) -> None:
        """B' sentences join, n fresh rows each (sample j drawn from ``seed + j``, as ``generate``)."""
        B, device = len(rules.ends) * self.n, self.ended.device
        self.ended = torch.cat([self.ended, torch.zeros(B, dtype=torch.bool, device=device)])
        self.log_prob = torch.cat([self.log_prob, torch.zeros(B, device=device)])
        if self.seed is not None:
            self.generators += [
                torch.Generator(device=device).manual_seed(self.seed + j)
                for j in list(range(self.n)) * (B // self.n)
            ]
        self.rules = self.rules.join(rules)

    def advance_all(
        self, logits: Tensor, tokens: Tensor, step: int | Tensor
    ) -> tuple[Tensor, Tensor, Tensor, dict[int, list[Hypothesis]]]:
        """One step of every row: as :meth:`_Beams.advance_all`."""
        c, n = self.config, self.n
        check_logits(logits, step if isinstance(step, int) else int(step.max()))
        sentence = torch.arange(len(self.ended) // n, device=logits.device).repeat_interleave(n)
        at = step if isinstance(step, int) else step.repeat_interleave(n)
        scores = self.rules(logits, tokens, at, sentence)
        if c.do_sample:
            token = draw(warp(scores, c.temperature, c.top_k, c.top_p), self.generators or None)
        else:
            token = scores.argmax(dim=-1)
        chosen = torch.log_softmax(logits, dim=-1).gather(1, token[:, None])[:, 0]
        self.log_prob += chosen.masked_fill(self.ended, 0.0)
        token = token.masked_fill(self.ended, self.fill_id)
        self.ended |= token == c.eos_token_id
        self.chosen = token  # (N,) every row's, for a stream
        done = self.ended.view(-1, n).all(dim=1)
        out = {}
        if bool(done.any()):
            ids = torch.cat([tokens[:, 1:], token[:, None]], dim=1)
            for p in done.nonzero()[:, 0].tolist():
                length = (step if isinstance(step, int) else int(step[p])) + 1
                out[p] = [self._hypothesis(ids[r], length, r) for r in range(p * n, p * n + n)]
        kept = (~done).nonzero()[:, 0]
        rows = rows_of(kept, n)
        self.take(kept, rows)
        return rows, token[rows], kept, out

    def _hypothesis(self, ids: Tensor, length: int, row: int) -> Hypothesis:
        """Row ``row``'s output from its last ``length`` tokens, up to its EOS."""
        tokens = ids[len(ids) - length :].tolist()
        tokens = tokens[: tokens.index(self.config.eos_token_id) + 1]
        lp = float(self.log_prob[row])
        return Hypothesis(tokens, lp, normalised(lp, len(tokens), self.config.length_penalty))

    def take(self, kept: Tensor, rows: Tensor | None = None) -> None:
        """Keep the sentences at positions ``kept`` (their ``rows``)."""
        rows = rows_of(kept, self.n) if rows is None else rows
        self.ended, self.log_prob = self.ended[rows], self.log_prob[rows]
        if self.generators:
            self.generators = [self.generators[r] for r in rows.tolist()]
        self.rules = self.rules.take(kept)


class ContinuousSearch:
    """``generate``'s search for ``config`` (beam search if ``num_beams > 1``, else sampling if
    ``do_sample``, else greedy search) over sentences that join between steps (:meth:`join`) and
    leave as they finish (:meth:`step`). ``seed``: sampling, as :func:`~scratchformer.generation.
    generate`'s. ``on_step(tags, tokens)``: greedy search and sampling, after each step, the tag of
    each row and the token (N,) it chose (a row that ended: the pad id), to stream, called once the
    step's bookkeeping is done (if it raises, the search is whole, and the outputs that finished at
    that step are lost with the step's return value). A model that
    the fast step cannot compute (:func:`~scratchformer.generation.fast_beam.reference_reason`) is
    a ``ValueError``."""

    def __init__(
        self,
        model: EncoderDecoder,
        config: GenerationConfig | None = None,
        seed: int | None = None,
        on_step: OnStep | None = None,
    ):
        reason = reference_reason(model)
        if reason is not None:
            raise ValueError(f"continuous batching steps the model itself, and cannot here: {reason}")
        self.model, self.config = model, config or GenerationConfig()
        self.seed, self.on_step = seed, on_step
        if self.config.num_beams > 1:
            check_n_best(self.config.num_return_sequences, self.config.num_beams)
        beams = self.config.num_beams
        self.rows_each = beams if beams > 1 else self.config.num_return_sequences  # at most
        self._reset()

    def _reset(self) -> None:
        self.tags: list[Tag] = []  # of the live sentences, in order
        self.decoder: DecoderStep | None = None
        self.state: _Beams | _Drawn | None = None
        self.tokens: Tensor | None = None  # (N, W): each row's tokens so far, BOS first, left-padded
        self.steps: Tensor | None = None  # (Bs,) the steps each live sentence has taken

    @property
    def live(self) -> int:
        """The sentences decoding."""
        return len(self.tags)

    @torch.no_grad()
    def join(
        self,
        src: Tensor,
        tags: Sequence[Tag],
        prefix: Sequence[Sequence[int]] | None = None,
        src_padding_mask: Tensor | None = None,
    ) -> None:
        """Sentences src (B', S') (or what the model encodes) join the search under ``tags``: encoded
        now, decoded from the next :meth:`step`. ``prefix``: one token list per sentence, forced
        first. Their rules are checked (as ``generate`` checks them) before any work."""
        c = self.config
        if len(tags) != src.shape[0]:
            raise ValueError(f"tags: expected one per source ({src.shape[0]}), got {len(tags)}")
        mask = self.model.source_padding_mask(src) if src_padding_mask is None else src_padding_mask
        lengths = [src.shape[1]] * src.shape[0] if mask is None else mask.sum(dim=1).tolist()
        rules = step_rules(self.model, src, c, prefix, lengths)
        memory, mask, _ = start_decoding(self.model, src, c.decoder_start_token_id, c.eos_token_id, mask)
        B, device = src.shape[0], src.device
        rows, length = (self.live + B) * self.rows_each, int(rules.ends.max()) + 1  # (room for k beams)
        if self.decoder is None:
            self.decoder = DecoderStep(self.model, memory, mask, rows, length)
            self.state = self._state(rules, device)
        else:
            self.decoder.add(memory, mask, rows, length)
        assert self.state is not None
        self.state.join(rules)
        start = torch.full(
            (B * self.state.width, 1), c.decoder_start_token_id, dtype=torch.long, device=device
        )
        self.tokens = start if self.tokens is None else _left_joined(self.tokens, start)
        zeros = torch.zeros(B, dtype=torch.long, device=device)
        self.steps = zeros if self.steps is None else torch.cat([self.steps, zeros])
        self.tags += list(tags)

    def _state(self, rules: StepRules, device: torch.device) -> _Beams | _Drawn:
        c = self.config
        if c.num_beams > 1:
            return _Beams(c.num_beams, rules, c.length_penalty, c.num_return_sequences, device)
        fill = self.model.config.pad_id if self.model.config.pad_id is not None else c.eos_token_id
        return _Drawn(c, rules, fill, self.seed, device)

    @torch.no_grad()
    def step(self) -> list[tuple[Tag, list[Hypothesis]]]:
        """One decoding step of every live sentence: the sentences that finished at it, each with
        its hypotheses (as ``generate`` returns them), in joining order. Nothing live: nothing."""
        if not self.tags:
            return []
        assert self.decoder is not None and self.state is not None
        assert self.tokens is not None and self.steps is not None
        k, at = self.state.width, self.steps.tolist()  # each sentence's: non-increasing (joining order)
        step = at[0] if at[0] == at[-1] else self.steps  # one for all: the step's and rules' fast paths
        positions = step if isinstance(step, int) else self.steps.repeat_interleave(k)
        logits = self.decoder(self.tokens[:, -1:], positions, k)
        rows, token, kept, ended = self.state.advance_all(logits, self.tokens, step)
        row_tags, drawn = [tag for tag in self.tags for _ in range(k)], self.state
        finished = [(self.tags[p], hyps) for p, hyps in ended.items()]
        if not len(kept):
            self._reset()
        else:
            kept_list = kept.tolist()
            filled = [at[p] + 1 for p in kept_list]  # the positions each kept sentence has written
            self.decoder.keep(rows, kept if ended else None, filled[0] if isinstance(step, int) else filled)
            if ended:
                self.decoder.trim()
            self.steps = self.steps[kept] + 1
            self.tokens = torch.cat([self.tokens[rows], token[:, None]], dim=1)[:, -(filled[0] + 1) :]
            self.tags = [self.tags[p] for p in kept_list]
        if self.on_step is not None and isinstance(drawn, _Drawn):  # (once the search is whole again)
            self.on_step(row_tags, drawn.chosen)
        return finished

    @torch.no_grad()
    def cancel(self, tags: Sequence[Tag]) -> None:
        """Drop the live sentences under ``tags`` (their requests went away): they are not decoded
        further."""
        gone = set(tags)
        positions = [p for p, tag in enumerate(self.tags) if tag not in gone]
        if len(positions) == len(self.tags):
            return
        if not positions:
            self._reset()
            return
        assert self.decoder is not None and self.state is not None and self.steps is not None
        assert self.tokens is not None
        kept = torch.tensor(positions, device=self.steps.device)
        rows = rows_of(kept, self.state.width)
        self.decoder.keep(rows, kept, (self.steps[kept] + 1).tolist())
        self.decoder.trim()
        self.state.take(kept)
        self.steps = self.steps[kept]
        self.tokens = self.tokens[rows][:, -(int(self.steps.max()) + 1) :]
        self.tags = [self.tags[p] for p in positions]


def _left_joined(tokens: Tensor, new: Tensor) -> Tensor:
    """Rows ``new`` (N', W') under ``tokens`` (N, W), the narrower left-padded with its first token."""
    width = max(tokens.shape[1], new.shape[1])
    padded = [torch.cat([t[:, :1].expand(-1, width - t.shape[1]), t], dim=1) for t in (tokens, new)]
    return torch.cat(padded)
