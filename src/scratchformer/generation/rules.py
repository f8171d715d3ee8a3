"""What may come next at each decoding step: the rules every search applies to the next-token scores
(logits for greedy and sampling, log-probabilities for beam search, as Hugging Face does), in
Hugging Face's order::

    repetition penalty -> no repeated n-gram -> no EOS before min_new_tokens -> never BOS or pad
    -> a forced prefix -> only EOS at the length limit

Each row of a batch may stand for a sentence of its own or for one beam / sample of one; ``rows``
maps it to its sentence (for the prefix and the length limit). The step is the batch's, or one per
row where sentences joined a running batch at different steps
(:class:`~scratchformer.generation.continuous.ContinuousSearch`): then each row's tokens are the last
``step + 1`` of its left-padded row."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from scratchformer.generation.config import GenerationConfig
from scratchformer.generation.interface import EncoderDecoder, max_decode_length

__all__ = ["StepRules", "default_rules"]


class StepRules:
    """The rules of ``config`` for ``B`` sentences with forced ``prefixes`` (token lists, possibly
    empty) and at most ``new_tokens`` tokens after each prefix (the last one forced to EOS): one
    number for all, or one per sentence."""

    def __init__(
        self,
        config: GenerationConfig,
        pad_id: int | None,
        prefixes: Sequence[Sequence[int]],
        new_tokens: int | Sequence[int],
        device: torch.device | str = "cpu",
    ):
        self.config, self.eos = config, config.eos_token_id
        never = [config.decoder_start_token_id] + ([pad_id] if pad_id is not None else [])
        self.never = torch.tensor(sorted(set(never) - {self.eos}), device=device)
        longest = max(len(p) for p in prefixes)
        self.prefix = torch.full(
            (len(prefixes), longest + 1), -1, dtype=torch.long, device=device
        )  # -1: free
        for i, p in enumerate(prefixes):
            self.prefix[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
        self.prefix_len = torch.tensor([len(p) for p in prefixes], device=device)
        new = torch.as_tensor(new_tokens, device=device)
        self.ends = self.prefix_len + new - 1  # the step that must emit EOS
        self._counted()

    def _counted(self) -> None:
        """The steps the longest sentence takes, and the steps with a forced token somewhere."""
        self.steps = int(self.ends.max()) + 1 if len(self.ends) else 0
        self._forcing = set(range(self.prefix.shape[1] - 1)) | set(self.ends.tolist())

    def take(self, index: Tensor) -> StepRules:
        """The rules of sentences ``index`` (B',), in that order."""
        out = copy.copy(self)
        out.prefix, out.prefix_len, out.ends = self.prefix[index], self.prefix_len[index], self.ends[index]
        out._counted()
        return out

    def join(self, other: StepRules) -> StepRules:
        """These sentences' rules, then ``other``'s (the same config): sentences joining a running batch."""
        out, width = copy.copy(self), max(self.prefix.shape[1], other.prefix.shape[1])
        out.prefix = torch.cat(
            [F.pad(p, (0, width - p.shape[1]), value=-1) for p in (self.prefix, other.prefix)]
        )
        out.prefix_len = torch.cat([self.prefix_len, other.prefix_len])
        out.ends = torch.cat([self.ends, other.ends])
        out._counted()
        return out

    @classmethod
    def plain(
        cls,
        bos_id: int,
        eos_id: int,
        pad_id: int | None,
        batch: int,
        new_tokens: int,
        device: torch.device | str = "cpu",
        **options: Any,
    ) -> StepRules:
        """No prefix; never BOS or pad; EOS at ``new_tokens``; ``options``: other GenerationConfig fields."""
        config = GenerationConfig(decoder_start_token_id=bos_id, eos_token_id=eos_id, **options)
        return cls(config, pad_id, [[]] * batch, new_tokens, device)

    @property
    def reranks(self) -> bool:
        """Whether the rules change the scores of tokens they allow (the repetition penalty): then a
        search ranks by other log-probabilities than the model's, and reports the model's apart."""
        return self.config.repetition_penalty != 1.0

    def __call__(
        self,
        scores: Tensor,
        tokens: Tensor,
        step: int | Tensor,
        rows: Tensor | None = None,
        *,
        inplace: bool = False,
    ) -> Tensor:
        """scores (N, V) for the token after ``tokens`` (N, step + 1, BOS first) -> the scores allowed
        (-inf where not). ``step`` (N,): each row's own (its tokens: the last step + 1, left-padded
        with tokens of its own). ``rows`` (N,): the sentence of each row (default: row i is sentence i).
        ``inplace``: ``scores`` may be overwritten (the fast search's, which reads them no more);
        else they are left as they are."""
        c = self.config
        rows = torch.arange(scores.shape[0], device=scores.device) if rows is None else rows
        forced = self._forced(scores, step, rows)  # the model's own scores, read before any rule
        own = inplace  # whether ``scores`` may be written: the caller's to give, or a copy made here
        if c.repetition_penalty != 1.0:
            seen = scores.gather(1, tokens)
            scores = scores.scatter(
                1, tokens, torch.where(seen < 0, seen * c.repetition_penalty, seen / c.repetition_penalty)
            )
            own = True
        if c.no_repeat_ngram_size:
            scores, own = self._ban_repeated_ngrams(scores, tokens, step, own), True
        if c.min_new_tokens:
            early = step - self.prefix_len[rows] < c.min_new_tokens
            scores, own = scores if own else scores.clone(), True
            scores[early, self.eos] = float("-inf")
        scores = (scores if own else scores.clone()).index_fill_(1, self.never, float("-inf"))
        if forced is not None:  # a forced token: only it, with the model's own score for it
            index, token, kept = forced
            scores.index_fill_(0, index, float("-inf"))
            scores[index, token] = kept
        return scores

    def _forced(
        self, scores: Tensor, step: int | Tensor, rows: Tensor
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """The rows of ``scores`` (N, V) with a forced token at ``step`` (a prefix's, or EOS at the
        length limit): (their indices, their tokens, the scores of those), or None."""
        last = self.prefix.shape[1] - 1
        if isinstance(step, int):
            if step not in self._forcing:
                return None
            token = self.prefix[rows, min(step, last)]
        else:
            token = self.prefix[rows, step.clamp(max=last)]
        token = torch.where(self.ends[rows] == step, self.eos, token)
        index = (token >= 0).nonzero()[:, 0]
        if not len(index):
            return None
        token = token[index]
        return index, token, scores[index, token]

    def _ban_repeated_ngrams(
        self, scores: Tensor, tokens: Tensor, step: int | Tensor, inplace: bool
    ) -> Tensor:
        """-inf for every token that would complete an n-gram already in the row (BOS included, as
        HF): a row's last ``step + 1`` tokens; in ``scores`` itself if ``inplace``, else in a copy."""
        n = self.config.no_repeat_ngram_size
        scores = scores if inplace else scores.clone()
        if tokens.shape[1] + 1 < n:
            return scores
        lengths = [step + 1] * len(tokens) if isinstance(step, int) else (step + 1).tolist()
        for i, (row, length) in enumerate(zip(tokens.tolist(), lengths)):
            row = row[len(row) - length :]
            last = tuple(row[len(row) - n + 1 :]) if n > 1 else ()
            banned = {row[j + n - 1] for j in range(len(row) - n + 1) if tuple(row[j : j + n - 1]) == last}
            if banned:
                scores[i, list(banned)] = float("-inf")
        return scores


def default_rules(
    model: EncoderDecoder,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len_a: float,
    max_len_b: int,
    **options: Any,
) -> StepRules:
    """The rules of a search given none: never BOS or pad, EOS at ``max_len_a * S + max_len_b`` new
    tokens (:func:`max_decode_length`) for src (B, S); ``options``: other GenerationConfig fields."""
    steps = max_decode_length(model, src.shape[1], max_len_a, max_len_b)
    return StepRules.plain(bos_id, eos_id, model.config.pad_id, src.shape[0], steps, src.device, **options)
