"""One entry point for every encoder-decoder model: :func:`generate` runs greedy search, sampling
(temperature, top-k, top-p) or beam search by a :class:`GenerationConfig`, with the key/value
cache, a forced target prefix and the rules of :mod:`~scratchformer.generation.rules`::

    hyps = generate(model, src, GenerationConfig(num_beams=4, num_return_sequences=2))
    hyps[i][0].tokens, hyps[i][0].log_prob, hyps[i][0].score   # the best of sentence i
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from scratchformer.generation.config import GenerationConfig
from scratchformer.generation.fast_beam import fast_beam_search
from scratchformer.generation.hypotheses import Hypothesis, normalised
from scratchformer.generation.interface import EncoderDecoder, max_decode_length
from scratchformer.generation.rules import StepRules
from scratchformer.generation.stepwise import decode_stepwise

__all__ = ["generate"]


def _prefixes(
    prefix: Sequence[int] | Sequence[Sequence[int]] | None,
    batch: int,
    model: EncoderDecoder,
    config: GenerationConfig,
) -> list[list[int]]:
    """One token list per sentence (one list given: the same for all), checked against the vocabulary."""
    if prefix is None:
        return [[] for _ in range(batch)]
    lists = [list(prefix)] * batch if all(isinstance(t, int) for t in prefix) else [list(p) for p in prefix]
    if len(lists) != batch:
        raise ValueError(f"prefix: expected one token list per source ({batch}), got {len(lists)}")
    banned = {config.decoder_start_token_id, config.eos_token_id, model.config.pad_id}
    for p in lists:
        bad = [
            t for t in p if not isinstance(t, int) or not 0 <= t < model.config.tgt_vocab_size or t in banned
        ]
        if bad:
            raise ValueError(
                f"prefix: tokens {bad} are not allowed (outside [0, {model.config.tgt_vocab_size}), "
                "or BOS, EOS or pad)"
            )
    return lists


def step_rules(
    model: EncoderDecoder,
    src: Tensor,
    config: GenerationConfig,
    prefix: Sequence[int] | Sequence[Sequence[int]] | None,
    lengths: Sequence[int] | None = None,
) -> StepRules:
    """The rules of ``config`` for src (B, S) with the forced ``prefix``, the number of new tokens
    checked against the room the model's max_len leaves. ``lengths``: each source's own S in
    ``max_len_a * S + max_len_b`` (default: the padded S, fairseq's rule for a batch)."""
    prefixes = _prefixes(prefix, src.shape[0], model, config)
    longest = max(len(p) for p in prefixes)
    room = model.config.max_len - 1 - longest  # decoder positions left after BOS + prefix
    if room < 1:
        raise ValueError(
            f"prefix: {longest} tokens leave no room within the model's max_len={model.config.max_len}"
        )
    sources = [src.shape[1]] * src.shape[0] if lengths is None else lengths
    new_tokens = [
        min(config.max_new_tokens or max_decode_length(model, S, config.max_len_a, config.max_len_b), room)
        for S in sources
    ]
    if config.min_new_tokens >= min(new_tokens):
        raise ValueError(
            f"min_new_tokens={config.min_new_tokens} must be < the {min(new_tokens)} new tokens allowed "
            "here (max_new_tokens, or max_len_a * S + max_len_b, within the model's max_len)"
        )
    return StepRules(config, model.config.pad_id, prefixes, new_tokens, src.device)


def generate(
    model: EncoderDecoder,
    src: Tensor,
    config: GenerationConfig | None = None,
    prefix: Sequence[int] | Sequence[Sequence[int]] | None = None,
    seed: int | None = None,
    src_padding_mask: Tensor | None = None,
    on_step: Callable[[Tensor], None] | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch by ``config``: beam search if ``num_beams > 1``, else sampling if
    ``do_sample``, else greedy search; always with the key/value cache.

    Beam search is :func:`~scratchformer.generation.fast_beam.fast_beam_search` under every rule;
    it runs the readable :func:`~scratchformer.generation.beam_search` only where
    :func:`~scratchformer.generation.fast_beam.reference_reason` gives the reason: an
    :class:`~scratchformer.generation.Ensemble`, a model in training mode, a decoder of other layers
    than :class:`~scratchformer.core.decoder.DecoderLayer`, or within ``readable_beam_search()``.

    Args:
        model: a Transformer or CaptioningTransformer in eval mode.
        src: (B, S) source token ids (or what the model encodes, e.g. image features).
        prefix: tokens every output must start with: one list for all sources, or one per source.
            They are fed and scored like generated tokens; max/min_new_tokens count after them.
        seed: sampling only: sample j of every source draws from a generator seeded with
            ``seed + j``, so a source gets the same samples alone or in any batch (when the limit is
            ``max_new_tokens`` or not reached: ``a * S + b`` counts the padded S, as fairseq's).
            Different sources use the same streams.
        on_step: greedy search and sampling: called after each step with the (B * n,) tokens it
            chose (row ``i * n + j``: output j of source i; a finished row's: the pad id), to
            stream them. Beam search calls it never: its best hypothesis is known at the end.

    Returns:
        For each source, ``num_return_sequences`` hypotheses (tokens ending with EOS, without BOS;
        ``log_prob``: the model's summed log-probabilities; ``score``: ``log_prob / len ** length_penalty``,
        for beam search with the log-probabilities as the step rules left them, which rank the beams):
        the best first for beam search, in drawing order for samples.
    """
    config = config or GenerationConfig()
    rules = step_rules(model, src, config, prefix)
    if config.num_beams > 1:  # the reference's search, doing only the work it must (fast_beam.py)
        return fast_beam_search(
            model,
            src,
            bos_id=config.decoder_start_token_id,
            eos_id=config.eos_token_id,
            beam_size=config.num_beams,
            length_penalty=config.length_penalty,
            src_padding_mask=src_padding_mask,
            n_best=config.num_return_sequences,
            rules=rules,
        )
    return _stepwise(model, src, config, rules, seed, src_padding_mask, on_step)


def _stepwise(
    model: EncoderDecoder,
    src: Tensor,
    config: GenerationConfig,
    rules: StepRules,
    seed: int | None,
    src_padding_mask: Tensor | None,
    on_step: Callable[[Tensor], None] | None,
) -> list[list[Hypothesis]]:
    """Greedy search or sampling for :func:`generate` (its arguments): n hypotheses per source."""
    B, n = src.shape[0], config.num_return_sequences
    generators = None
    if config.do_sample and seed is not None:
        generators = [
            torch.Generator(device=src.device).manual_seed(seed + j) for _ in range(B) for j in range(n)
        ]
    tokens, log_prob, _ = decode_stepwise(
        model, src, rules, src_padding_mask=src_padding_mask, generators=generators, on_step=on_step
    )
    out: list[list[Hypothesis]] = []
    for row, (ids, lp) in enumerate(zip(tokens.tolist(), log_prob.tolist())):
        ids = ids[: ids.index(config.eos_token_id) + 1]
        if row % n == 0:
            out.append([])
        out[-1].append(Hypothesis(ids, lp, normalised(lp, len(ids), config.length_penalty)))
    return out
