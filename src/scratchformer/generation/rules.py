"""What may come next at each decoding step: the rules every search applies to the next-token scores
(logits for greedy and sampling, log-probabilities for beam search, as Hugging Face does), in
Hugging Face's order::

    repetition penalty -> no repeated n-gram -> no EOS before min_new_tokens -> never BOS or pad
    -> a forced prefix -> only EOS at the length limit

Each row of a batch may stand for a sentence of its own or for one beam / sample of one; ``rows``
maps it to its sentence (for the prefix and the length limit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from scratchformer.generation.config import GenerationConfig
from scratchformer.generation.interface import EncoderDecoder, max_decode_length

__all__ = ["StepRules", "default_rules"]


class StepRules:
    """The rules of ``config`` for ``B`` sentences with forced ``prefixes`` (token lists, possibly
    empty) and at most ``new_tokens`` tokens after each prefix (the last one forced to EOS)."""

    def __init__(
        self,
        config: GenerationConfig,
        pad_id: int | None,
        prefixes: Sequence[Sequence[int]],
        new_tokens: int,
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
        self.ends = self.prefix_len + new_tokens - 1  # the step that must emit EOS
        self.steps = int(self.ends.max()) + 1
        self._forcing = set(range(longest)) | set(self.ends.tolist())  # steps with a forced token somewhere

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
        self, scores: Tensor, tokens: Tensor, step: int, rows: Tensor | None = None, *, inplace: bool = False
    ) -> Tensor:
        """scores (N, V) for the token after ``tokens`` (N, step + 1, BOS first) -> the scores allowed
        (-inf where not). ``rows`` (N,): the sentence of each row (default: row i is sentence i).
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
            scores, own = self._ban_repeated_ngrams(scores, tokens, own), True
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

    def _forced(self, scores: Tensor, step: int, rows: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """The rows of ``scores`` (N, V) with a forced token at ``step`` (a prefix's, or EOS at the
        length limit): (their indices, their tokens, the scores of those), or None."""
        if step not in self._forcing:
            return None
        token = self.prefix[rows, min(step, self.prefix.shape[1] - 1)]
        token = torch.where(self.ends[rows] == step, self.eos, token)
        index = (token >= 0).nonzero()[:, 0]
        if not len(index):
            return None
        token = token[index]
        return index, token, scores[index, token]

    def _ban_repeated_ngrams(self, scores: Tensor, tokens: Tensor, inplace: bool) -> Tensor:
        """-inf for every token that would complete an n-gram already in the row (BOS included, as
        HF); in ``scores`` itself if ``inplace``, else in a copy."""
        n = self.config.no_repeat_ngram_size
        scores = scores if inplace else scores.clone()
        if tokens.shape[1] + 1 < n:
            return scores
        for i, row in enumerate(tokens.tolist()):
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
