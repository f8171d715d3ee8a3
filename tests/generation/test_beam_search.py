"""Beam search: equals greedy at beam 1, beats greedy where greedy is suboptimal, stops finished
hypotheses, batches exactly, and decodes incrementally with the cache."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_decoding import random_model
from test_decoding import sources as decoding_sources

import scratchformer as sf
from scratchformer.generation import beam_search

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4


class ScriptedModel:
    """A 'model' whose next-token distribution is a table keyed by the prefix generated so far."""

    training = False

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]):
        self.table = table
        self.config = SimpleNamespace(pad_id=PAD, tgt_vocab_size=5, max_len=64)
        self.decoder = SimpleNamespace(layers=[None])  # decoding gives it a one-layer DecoderCache

    def source_padding_mask(self, src):
        return src != PAD

    def encode(self, src, src_padding_mask=None):
        return torch.zeros(src.shape[0], src.shape[1], 1)

    def decode(self, tgt, memory, src_padding_mask=None, cache=None):
        token = tgt[:, -1:].float()[:, None, :, None]  # (B, 1, 1, 1): the cache keeps each row's history
        history, _ = cache.layers[0].self_attn.append(token, token)  # and beam search reorders it
        logits = torch.full((tgt.shape[0], 1, 5), -1e9)
        for i, row in enumerate(history[:, 0, :, 0].long().tolist()):
            for t, p in self.table.get(tuple(row[1:]), {EOS: 1.0}).items():
                logits[i, 0, t] = math.log(p)
        return logits


# Greedy takes A (0.6), then A (0.35), then EOS: P = 0.21. The best sequence is B EOS: P = 0.36.
GREEDY_TRAP = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.3, A: 0.35, B: 0.35},
    (A, A): {EOS: 1.0},
    (A, B): {EOS: 1.0},
    (B,): {EOS: 0.9, A: 0.1},
}


def test_beam_search_finds_the_better_sequence_greedy_misses() -> None:
    model = ScriptedModel(GREEDY_TRAP)
    src = torch.ones(1, 3, dtype=torch.long)
    greedy = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS)  # type: ignore[arg-type]
    assert greedy[0].tolist() == [A, A, EOS]
    best = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=2, length_penalty=0.0)[0][0]  # type: ignore[arg-type]
    assert best.tokens == [B, EOS]
    assert best.log_prob == pytest.approx(math.log(0.4 * 0.9))
    assert best.log_prob > math.log(0.6 * 0.35 * 1.0)


def test_finished_hypotheses_stop_growing() -> None:
    model = ScriptedModel(GREEDY_TRAP)
    hyps = beam_search(
        model,
        torch.ones(2, 3, dtype=torch.long),
        bos_id=BOS,
        eos_id=EOS,  # type: ignore[arg-type]
        beam_size=3,
        n_best=3,
        length_penalty=0.0,
    )
    for sentence in hyps:
        assert len(sentence) == 3
        for h in sentence:
            assert h.tokens[-1] == EOS and EOS not in h.tokens[:-1]
        assert [h.score for h in sentence] == sorted((h.score for h in sentence), reverse=True)
        # B EOS (0.36), A EOS (0.18), then A A EOS or A B EOS (0.21 * ... ) in score order
        assert sentence[0].tokens == [B, EOS]


def sources(seed: int) -> torch.Tensor:
    return decoding_sources(torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(3))
def test_beam_size_one_equals_greedy(seed: int) -> None:
    model, src = random_model(seed), sources(seed)
    greedy = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_a=1.2, max_len_b=10)
    beams = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, max_len_a=1.2, max_len_b=10)
    for row, hyps in zip(greedy.tolist(), beams):
        assert hyps[0].tokens == row[: row.index(EOS) + 1]


def test_batch_equals_one_by_one() -> None:
    model, src = random_model(4), sources(4)
    batch = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=2, max_len_a=0, max_len_b=12)
    for i in range(src.shape[0]):
        n = int((src[i] != PAD).sum())
        single = beam_search(
            model,
            src[i : i + 1, :n],
            bos_id=BOS,
            eos_id=EOS,
            beam_size=4,
            n_best=2,
            max_len_a=0,
            max_len_b=12,
        )
        assert [h.tokens for h in batch[i]] == [h.tokens for h in single[0]]
        assert [h.score for h in batch[i]] == pytest.approx([h.score for h in single[0]], abs=1e-4)


def test_beam_search_feeds_one_position_per_step() -> None:
    model = random_model(5)
    seen: list[int] = []
    attention = model.decoder.layers[0].self_attn  # its query (B, T, D): T new positions
    hook = attention.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        beam_search(model, sources(5), bos_id=BOS, eos_id=EOS, beam_size=3, max_len_b=5)
    finally:
        hook.remove()
    assert seen and set(seen) == {1}


def test_length_penalty_prefers_longer_output() -> None:
    model = ScriptedModel(GREEDY_TRAP)
    src = torch.ones(1, 3, dtype=torch.long)
    raw = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=3, length_penalty=0.0)[0]  # type: ignore[arg-type]
    long = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=3, length_penalty=5.0)[0]  # type: ignore[arg-type]
    assert len(long[0].tokens) > len(raw[0].tokens)
    for h in long:
        assert h.score == pytest.approx(h.log_prob / len(h.tokens) ** 5.0)


def test_does_not_stop_at_the_first_k_short_finishes() -> None:
    """With beam 2, '' and 'B' finish first; stopping there (fairseq's rule) would miss 'A A',
    whose normalised score (log 0.4 / 3 = -0.31) beats both (-1.20 and -0.80)."""
    table = {(): {A: 0.5, EOS: 0.3, B: 0.2}, (A,): {A: 0.8, EOS: 0.2}, (B,): {EOS: 1.0}, (A, A): {EOS: 1.0}}
    hyps = beam_search(
        ScriptedModel(table),
        torch.ones(1, 2, dtype=torch.long),
        bos_id=BOS,
        eos_id=EOS,  # type: ignore[arg-type]
        beam_size=2,
        n_best=2,
        length_penalty=1.0,
    )[0]
    assert hyps[0].tokens == [A, A, EOS]
    assert hyps[0].score == pytest.approx(math.log(0.4) / 3)
