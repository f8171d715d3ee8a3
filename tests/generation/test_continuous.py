"""Continuous batching (generation/continuous.py): sentences that join a running search at any step
get the outputs they get alone (fp32; beam and greedy search up to ties of rounding, sampling with
the same seeds), under every rule; the memory is padded to the longest live source only; a
sentence can be dropped; without positions per row the check fails (the mutation)."""

from __future__ import annotations

import pytest
import torch

from scratchformer.generation import Ensemble, GenerationConfig, generate
from scratchformer.generation.continuous import ContinuousSearch
from scratchformer.generation.fast_step import DecoderStep
from scratchformer.generation.scoring import same_up_to_ties
from tests.generation.test_fast_beam import BOS, EOS, PAD, padded_sources, sharp_model

LENGTHS = (9, 3, 6, 1, 8, 5, 7, 2, 4, 9)
SEED = 11
CONFIGS = {
    "beam": {"num_beams": 4, "num_return_sequences": 2, "length_penalty": 0.6},
    "greedy": {"num_beams": 1},
    "sampling": {"do_sample": True, "num_return_sequences": 3, "top_k": 10, "num_beams": 1},
    "rules": {"num_beams": 3, "no_repeat_ngram_size": 2, "repetition_penalty": 1.5, "min_new_tokens": 3},
}
ONE_A_STEP = [[i] for i in range(len(LENGTHS))]
BURSTS = [[0, 1, 2], [], [3], [4, 5, 6, 7], [], [], [8], [9]]


def config_of(name: str) -> GenerationConfig:
    return GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, **CONFIGS[name])


def alone(model, src: torch.Tensor, config: GenerationConfig, prefixes=None) -> dict[int, list]:
    """Each sentence decoded by itself (its own length, no padding)."""
    out = {}
    for i in range(len(src)):
        n = int((src[i] != PAD).sum())
        prefix = None if prefixes is None else [prefixes[i]]
        out[i] = generate(model, src[i : i + 1, :n], config, prefix, seed=SEED)[0]
    return out


def continuously(model, src, config, arrivals, prefixes=None, search=None) -> dict[int, list]:
    """The sentences joining a running search at the steps ``arrivals`` lists (several at a step:
    one padded batch), then decoded to the end."""
    search = search or ContinuousSearch(model, config, seed=SEED)
    out, step = {}, 0
    while step < len(arrivals) or search.live:
        if step < len(arrivals) and arrivals[step]:
            index = arrivals[step]
            batch = src[index][:, : int((src[index] != PAD).sum(dim=1).max())]
            search.join(batch, index, None if prefixes is None else [prefixes[i] for i in index])
        out.update(search.step())
        step += 1
    return out


def tokens(hyps) -> list[list[int]]:
    return [h.tokens for h in hyps]


def assert_as_alone(model, src, got: dict, expected: dict, name: str) -> None:
    """Every sentence: its outputs alone; where a search differs, only by a tie (a near-equal
    score, for beam and greedy search without rules), and in at most one sentence."""
    assert sorted(got) == sorted(expected)
    differ = [i for i in expected if tokens(got[i]) != tokens(expected[i])]
    assert len(differ) <= 1, f"{name}: sentences {differ} differ from their outputs alone"
    for i in differ if name in ("beam", "greedy") else []:
        n = int((src[i] != PAD).sum())
        report = same_up_to_ties(
            model, src[i : i + 1, :n], [got[i][0].tokens], [expected[i][0].tokens], bos_id=BOS,
            length_penalty=CONFIGS[name].get("length_penalty", 1.0),
        )  # fmt: skip
        assert report.ok, report.describe()
    for i in expected:  # scores: fp32 rounding of another order of adding (greedy and sampling alone
        # run the core's decode, the search the fast step) on logits up to ~100 (weights x3): up to
        # 3e-4 over a sentence under AVX2 kernels
        for g, e in zip(got[i], expected[i]):
            if g.tokens == e.tokens:
                assert g.score == pytest.approx(e.score, rel=1e-3, abs=1e-3)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("arrivals", [ONE_A_STEP, BURSTS], ids=["one_a_step", "bursts"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
def test_sentences_that_join_at_any_step_get_their_outputs_alone(name, arrivals, norm_first) -> None:
    model, src = sharp_model(3, norm_first), padded_sources(3, LENGTHS)
    config = config_of(name)
    assert_as_alone(model, src, continuously(model, src, config, arrivals), alone(model, src, config), name)


def test_each_sentence_has_its_own_prefix_and_length_limit() -> None:
    """A forced prefix per sentence, and ``max_len_a * S + max_len_b`` of each sentence's own S
    (as alone), not of the padded batch: the limit is reached here (max_len_b 2)."""
    model, src = sharp_model(5, False), padded_sources(5, LENGTHS)
    config = config_of("beam").replace(max_len_a=0.5, max_len_b=2)
    prefixes = [[3 + i % 5] * (i % 3) for i in range(len(LENGTHS))]
    got = continuously(model, src, config, BURSTS, prefixes)
    expected = alone(model, src, config, prefixes)
    assert_as_alone(model, src, got, expected, "rules")
    own = [len(p) + int(0.5 * n) + 2 for p, n in zip(prefixes, LENGTHS)]  # with EOS
    assert all(len(got[i][0].tokens) <= own[i] for i in got)
    reached = [i for i in got if len(got[i][0].tokens) == own[i] and LENGTHS[i] < max(LENGTHS) - 1]
    assert reached, "no short sentence reached its own limit: the test would not see a padded one"


def test_without_positions_per_row_newcomers_decode_wrong(monkeypatch) -> None:
    """The mutation: every row at the batch's latest position (one position for all, as a search
    whose sentences all start together has it) makes the newcomers' outputs differ."""
    model, src = sharp_model(3, False), padded_sources(3, LENGTHS)
    config = config_of("greedy")
    expected = alone(model, src, config)
    positions = DecoderStep._positions
    monkeypatch.setattr(
        DecoderStep, "_positions", lambda self, t: positions(self, t if isinstance(t, int) else int(t.max()))
    )
    got = continuously(model, src, config, ONE_A_STEP)
    assert sum(tokens(got[i]) != tokens(expected[i]) for i in expected) >= 3


def test_the_memory_is_padded_to_the_longest_live_source_only() -> None:
    """The batch's memory keys/values widen when a longer source joins and narrow when it leaves;
    rows are k per live sentence."""
    model, src = sharp_model(3, False), padded_sources(3, (9, 2, 3))
    search = ContinuousSearch(model, config_of("beam"))
    search.join(src[1:3, :3], [1, 2])
    assert search.decoder.memory_kv[0][0].shape[1] == 3
    search.step()
    search.join(src[:1], [0])
    assert search.decoder.memory_kv[0][0].shape[1] == 9 and search.tokens.shape[0] == 3 * 4
    widths = {}
    while search.live:
        done = search.step()
        if search.live:
            widths[tuple(sorted(search.tags))] = search.decoder.memory_kv[0][0].shape[1]
            assert search.tokens.shape[0] == 4 * search.live
        assert all(tag in (0, 1, 2) for tag, _ in done)
    assert all(width == (9 if 0 in tags else 3) for tags, width in widths.items()), widths


def test_a_cancelled_sentence_is_decoded_no_further_and_the_rest_as_alone() -> None:
    model, src = sharp_model(3, False), padded_sources(3, LENGTHS)
    config = config_of("beam")
    search = ContinuousSearch(model, config, seed=SEED)
    search.join(src[:4, :9], [0, 1, 2, 3])
    search.step()
    search.cancel([0, 2])
    assert search.tags == [1, 3]
    got = continuously(model, src, config, [[], [4]], search=search)
    expected = alone(model, src, config)
    assert sorted(got) == [1, 3, 4]
    assert_as_alone(model, src, got, {i: expected[i] for i in got}, "beam")


def test_a_model_the_fast_step_cannot_compute_is_refused() -> None:
    with pytest.raises(ValueError, match="continuous batching .* an Ensemble"):
        ContinuousSearch(Ensemble([sharp_model(0, False)]), config_of("beam"))
    search = ContinuousSearch(sharp_model(0, False), config_of("beam"))
    with pytest.raises(ValueError, match="tags: expected one per source"):
        search.join(padded_sources(0, (3, 2)), ["only one"])
    assert search.step() == [] and search.live == 0


def test_images_that_join_a_running_captioning_search_get_their_captions_alone() -> None:
    """The captioning Transformer (image features as memory) under the same search."""
    import scratchformer as sf

    torch.manual_seed(0)
    config = sf.CaptioningConfig(
        vocab_size=30, input="features", feature_dim=12, d_model=32, num_heads=4, d_ff=64,
        num_encoder_layers=1, num_decoder_layers=2, dropout=0.0, pad_id=PAD,
    )  # fmt: skip
    model = sf.CaptioningTransformer(config).eval()
    with torch.no_grad():
        for parameter in model.decoder.parameters():
            parameter.mul_(3.0)
    images = torch.randn(6, 7, 12)
    for name in ("beam", "greedy"):
        generation = config_of(name)
        expected = {i: generate(model, images[i : i + 1], generation)[0] for i in range(6)}
        search, got, step = ContinuousSearch(model, generation), {}, 0
        while step < 6 or search.live:
            if step < 6:
                search.join(images[step : step + 1], [step])
            got.update(search.step())
            step += 1
        assert {i: tokens(h) for i, h in got.items()} == {i: tokens(h) for i, h in expected.items()}


def test_a_stream_that_raises_leaves_the_search_whole() -> None:
    """``on_step`` runs once the step's bookkeeping is done: a caller that catches its error and
    steps on gets every sentence's outputs alone."""
    model, src = sharp_model(3, False), padded_sources(3, LENGTHS)
    config = config_of("sampling")
    calls = []

    def stream(tags, tokens) -> None:
        calls.append(len(tags))
        if len(calls) == 2:
            raise RuntimeError("the client's socket closed")

    search, got = ContinuousSearch(model, config, seed=SEED, on_step=stream), {}
    search.join(src[:4, :9], [0, 1, 2, 3])
    while search.live:
        try:
            got.update(search.step())
        except RuntimeError:
            pass
    expected = alone(model, src[:4], config)
    assert_as_alone(model, src[:4], got, expected, "sampling")
    assert calls[0] == 4 * 3  # every row of the step, its tag each
