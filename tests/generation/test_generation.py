"""generate() and GenerationConfig: sampling (temperature, top-k, top-p) against the renormalised
distributions of a hand-built model with known next-token probabilities; the limits that equal
greedy search; seeds; the repetition rules, the minimum length and forced prefixes; every option
checked. (Token-for-token agreement with Hugging Face's generate: tests/formats/test_hf_checkpoints.py.)"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_decoding import random_model, sources
from torch import Tensor, nn

import scratchformer as sf
from scratchformer.generation import GenerationConfig, generate, warp

PAD, BOS, EOS = 0, 1, 2
PROBS = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08])  # of tokens 3..7 after BOS


class KnownNext(nn.Module):
    """A hand-built encoder-decoder: the next token's log-probabilities depend only on the last
    token, by a (V, V) table; the source is ignored."""

    def __init__(self, table: Tensor):
        super().__init__()
        self.table = table.log()
        self.config = SimpleNamespace(pad_id=PAD, tgt_vocab_size=table.shape[0], max_len=64)
        self.decoder = SimpleNamespace(layers=[])

    def source_padding_mask(self, src: Tensor) -> Tensor:
        return src != PAD

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        return torch.zeros(src.shape[0], 1, 1)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None, cache=None
    ) -> Tensor:
        return self.table[tgt]  # (N, T, V) log-probabilities as logits


def first_token_model() -> KnownNext:
    """After BOS: PROBS over tokens 3..7; after any other token: EOS."""
    table = torch.full((8, 8), 1e-9)
    table[BOS, 3:] = PROBS
    table[3:, EOS] = 1.0
    return KnownNext(table / table.sum(1, keepdim=True)).eval()


def cycle_model() -> KnownNext:
    """Prefers 3 -> 4 -> 3 -> 4 ... (and 5 -> 6 -> 5), EOS unlikely: repetition everywhere."""
    table = torch.full((8, 8), 0.01)
    table[BOS, 3], table[3, 4], table[4, 3], table[5, 6], table[6, 5] = 5.0, 5.0, 5.0, 5.0, 5.0
    table[:, 5] += 0.5
    table[:, EOS] = 0.05
    return KnownNext(table / table.sum(1, keepdim=True)).eval()


def draw_first_tokens(config: GenerationConfig, n: int = 20000) -> Tensor:
    """Empirical distribution of the first token over tokens 3..7, from n samples."""
    torch.manual_seed(0)
    hyps = generate(
        first_token_model(), torch.tensor([[3]]), config.replace(num_return_sequences=n, max_new_tokens=2)
    )
    firsts = torch.tensor([h.tokens[0] for h in hyps[0]])
    return torch.bincount(firsts - 3, minlength=5).float() / n


def total_variation(p: Tensor, q: Tensor) -> float:
    return float((p - q).abs().sum() / 2)


SAMPLING = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, do_sample=True)


@pytest.mark.parametrize(
    "options, expected, wrong",
    [
        ({}, PROBS, torch.tensor([0.2] * 5)),
        (
            {"top_k": 3},
            torch.tensor([0.40, 0.25, 0.15, 0, 0]) / 0.8,  # renormalised over the top 3
            torch.tensor([0.40, 0.25, 0.15, 0.20, 0]),
        ),  # not renormalised (the rest on one token)
        (
            {"top_p": 0.7},
            torch.tensor([0.40, 0.25, 0.15, 0, 0]) / 0.8,  # smallest set reaching 0.7: 3 tokens
            torch.tensor([0.40, 0.25, 0, 0, 0]) / 0.65,
        ),  # stopping one short of 0.7
        ({"temperature": 2.0}, PROBS.sqrt() / PROBS.sqrt().sum(), PROBS),
        (
            {"temperature": 0.5, "top_k": 2},
            PROBS[:2] ** 2 / (PROBS[:2] ** 2).sum() @ torch.eye(2, 5),
            PROBS[:2] / PROBS[:2].sum() @ torch.eye(2, 5),
        ),
    ],
)
def test_sampled_frequencies_match_the_renormalised_distribution(options, expected, wrong) -> None:
    """20,000 draws: within 0.02 total variation of the right distribution (the sampling error is
    about 0.006), and far from a wrong renormalisation, so the check can fail."""
    empirical = draw_first_tokens(SAMPLING.replace(**options))
    assert total_variation(empirical, expected) < 0.02, (empirical, expected)
    assert total_variation(empirical, wrong) > 0.05


def test_warp_is_hugging_faces_order_and_rule() -> None:
    scores = torch.log(PROBS)[None]
    kept = warp(scores, top_p=0.6)
    assert torch.isfinite(kept).tolist() == [[True, True, False, False, False]]  # 0.40 + 0.25 reaches 0.6
    assert torch.isfinite(warp(scores, top_p=1e-9)).sum() == 1  # at least one token stays
    assert torch.equal(warp(scores, top_k=1).argmax(-1), scores.argmax(-1))


@pytest.mark.parametrize("options", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}])
def test_sampling_limits_equal_greedy(options) -> None:
    model = random_model(3)
    src = sources(torch.Generator().manual_seed(3))
    greedy = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_a=0, max_len_b=12)
    sampled = generate(model, src, SAMPLING.replace(max_len_a=0, max_len_b=12, **options), seed=5)
    for row, hyps in zip(greedy.tolist(), sampled):
        assert hyps[0].tokens == row[: row.index(EOS) + 1]


def test_generate_greedy_and_beam_equal_the_searches() -> None:
    model = random_model(4)
    src = sources(torch.Generator().manual_seed(4))
    base = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_len_a=1.0, max_len_b=10)
    greedy = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS)
    for row, hyps in zip(greedy.tolist(), generate(model, src, base)):
        assert hyps[0].tokens == row[: row.index(EOS) + 1]
    beams = sf.beam_search(
        model,
        src,
        bos_id=BOS,
        eos_id=EOS,
        beam_size=4,
        length_penalty=0.6,
        max_len_a=1.0,
        max_len_b=10,
        n_best=3,
    )
    ours = generate(model, src, base.replace(num_beams=4, length_penalty=0.6, num_return_sequences=3))
    assert [[h.tokens for h in n] for n in ours] == [[h.tokens for h in n] for n in beams]


def test_a_seed_gives_the_same_samples_twice_and_in_any_batch() -> None:
    model = random_model(5)
    src = sources(torch.Generator().manual_seed(5))
    config = SAMPLING.replace(max_new_tokens=8, num_return_sequences=3, temperature=1.5)
    first, again = generate(model, src, config, seed=11), generate(model, src, config, seed=11)
    assert [[h.tokens for h in n] for n in first] == [[h.tokens for h in n] for n in again]
    for i in range(src.shape[0]):  # one at a time, unpadded
        alone = generate(model, src[i : i + 1, : int((src[i] != PAD).sum())], config, seed=11)
        assert [h.tokens for h in alone[0]] == [h.tokens for h in first[i]]
    assert len({tuple(h.tokens) for n in first for h in n}) > 3  # really random
    other = generate(model, src, config, seed=12)
    assert [[h.tokens for h in n] for n in other] != [[h.tokens for h in n] for n in first]


@pytest.mark.parametrize("search", ["greedy", "sampling"])
def test_on_step_sees_each_token_as_it_is_chosen(search) -> None:
    """Streaming: the steps' tokens, row by row, are the outputs (then the pad id once a row ended);
    beam search calls it never (its best hypothesis is known only at the end)."""
    model = random_model(6)
    src = sources(torch.Generator().manual_seed(6))
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_new_tokens=9)
    if search == "sampling":
        config = config.replace(do_sample=True, num_return_sequences=2)
    steps: list[Tensor] = []
    out = generate(model, src, config, seed=1, on_step=steps.append)
    rows = torch.stack(steps, dim=1).tolist()
    for r, row in enumerate(rows):
        tokens = out[r // config.num_return_sequences][r % config.num_return_sequences].tokens
        assert row[: len(tokens)] == tokens and set(row[len(tokens) :]) <= {PAD}
    beam_steps: list[Tensor] = []
    generate(
        model,
        src,
        config.replace(num_beams=3, do_sample=False, num_return_sequences=1),
        on_step=beam_steps.append,
    )
    assert beam_steps == []


def ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


@pytest.mark.parametrize("search", [{}, {"num_beams": 3}, {"do_sample": True}])
def test_no_repeat_ngram_on_a_model_that_loves_repetition(search) -> None:
    model, src = cycle_model(), torch.tensor([[3, 4], [5, 5]])
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_new_tokens=12, **search)
    free = generate(model, src, config, seed=0)
    assert any(
        len(set(ngrams([BOS] + h.tokens, 2))) < len(ngrams([BOS] + h.tokens, 2)) for n in free for h in n
    )
    for size in (2, 3):
        for n_best in generate(model, src, config.replace(no_repeat_ngram_size=size), seed=0):
            for h in n_best:
                grams = ngrams([BOS] + h.tokens, size)  # BOS counts, as in Hugging Face
                assert len(set(grams)) == len(grams), h.tokens


def eos_first_model() -> KnownNext:
    table = torch.full((8, 8), 0.05)
    table[:, EOS] = 0.7
    return KnownNext(table / table.sum(1, keepdim=True)).eval()


@pytest.mark.parametrize("search", [{}, {"num_beams": 3, "num_return_sequences": 3}, {"do_sample": True}])
def test_min_new_tokens_delays_eos(search) -> None:
    model, src = eos_first_model(), torch.tensor([[3], [4]])
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_new_tokens=10, **search)
    assert all(n[0].tokens == [EOS] for n in generate(model, src, config, seed=0))  # EOS at once
    for n in generate(model, src, config.replace(min_new_tokens=4), seed=0):
        assert all(len(h.tokens) >= 5 and h.tokens[-1] == EOS for h in n)
        assert (
            config.do_sample or len(n[0].tokens) == 5
        )  # searches: 4 tokens, then EOS at once, the likeliest


@pytest.mark.parametrize("search", [{}, {"num_beams": 3, "num_return_sequences": 3}, {"do_sample": True}])
def test_log_prob_is_the_models_own_under_a_repetition_penalty(search) -> None:
    """The penalty reshapes the scores that choose (and, for beams, rank: the score, as Hugging
    Face's sequences_scores); log_prob stays the model's log-probability of the tokens, whatever the
    search."""
    model, src = cycle_model(), torch.tensor([[3], [4]])
    config = GenerationConfig(
        decoder_start_token_id=BOS,
        eos_token_id=EOS,
        max_new_tokens=6,
        min_new_tokens=5,
        repetition_penalty=1.5,
        **search,
    )
    for h in (h for n_best in generate(model, src, config, seed=0) for h in n_best):
        path = [BOS] + h.tokens
        expected = sum(float(model.table[a, b]) for a, b in zip(path, path[1:]))
        assert h.log_prob == pytest.approx(expected, abs=1e-5)
        if search.get("num_beams"):  # penalised repeats: the ranking score sits below the model's
            assert h.score < expected / len(h.tokens) ** config.length_penalty - 1e-3


@pytest.mark.parametrize("search", [{}, {"num_beams": 3, "num_return_sequences": 2}, {"do_sample": True}])
def test_a_forced_prefix_is_respected_and_scored(search) -> None:
    model, src = cycle_model(), torch.tensor([[3], [4]])
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_new_tokens=3, **search)
    prefixes = [[7, 6, 7], [6]]  # unlikely tokens, of different lengths
    for prefix, n_best in zip(prefixes, generate(model, src, config, prefix=prefixes, seed=0)):
        for h in n_best:
            assert h.tokens[: len(prefix)] == prefix and len(h.tokens) == len(prefix) + 3  # + 2 tokens, EOS
            path = [BOS] + h.tokens
            expected = sum(float(model.table[a, b]) for a, b in zip(path, path[1:]))  # the model's log-probs
            assert h.log_prob == pytest.approx(expected, abs=1e-5)
            assert h.score == pytest.approx(expected / len(h.tokens) ** config.length_penalty, abs=1e-5)
    one = generate(model, src, config, prefix=[7])  # one list: the same prefix for every source
    assert all(n[0].tokens[0] == 7 for n in one)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": -1.0}, "temperature must be > 0"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"num_return_sequences": 3, "num_beams": 2}, "num_return_sequences=3 > num_beams=2"),
        ({"do_sample": True, "num_beams": 2}, "sampling inside beams is not supported"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size must be an integer >= 0"),
        ({"min_new_tokens": 3, "max_new_tokens": 3}, "min_new_tokens=3 must be < max_new_tokens=3"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"length_penalty": math.nan}, "length_penalty must be a finite number"),
        ({"num_beams": 2.5}, "num_beams must be an integer"),
    ],
)
def test_every_option_is_checked_with_its_name(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**options)


def test_bad_prefixes_are_named() -> None:
    model, src = cycle_model(), torch.tensor([[3], [4]])
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"prefix: tokens \[2\] are not allowed"):
        generate(model, src, config, prefix=[5, EOS])
    with pytest.raises(ValueError, match=r"prefix: expected one token list per source \(2\), got 3"):
        generate(model, src, config, prefix=[[5], [5], [5]])
    with pytest.raises(ValueError, match="leave no room within the model's max_len=64"):
        generate(model, src, config, prefix=[5] * 70)
    with pytest.raises(ValueError, match="min_new_tokens=4 must be < the 3 new tokens allowed here"):
        generate(
            model, src, config.replace(max_new_tokens=None, max_len_a=0.0, max_len_b=3, min_new_tokens=4)
        )
