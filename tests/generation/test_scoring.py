"""The rule every beam-identity test uses (generation/scoring.py): a hypothesis's teacher-forced,
length-normalised log-probability is the score the beam ranked it by (checked against the beam's
own incremental, cached computation), and two engines' outputs are "the same up to ties" only when
every differing line's two outputs score within the tolerance: a real tie passes, a changed token
fails."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decoding import random_model, sources

from scratchformer.generation import Ensemble, beam_search
from scratchformer.generation.scoring import TIE_TOLERANCE, same_up_to_ties, sequence_score, sequence_scores

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models decode fastest on one thread (a busy machine does not stall them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def model_of(seed: int):
    """A random model whose EOS is likelier (its output bias + 1): hypotheses end at many lengths."""
    model = random_model(seed)
    with torch.no_grad():
        model.generator.bias[EOS] += 1.0
    return model


def n_best(model, src, length_penalty: float, n: int = 3):
    return beam_search(
        model, src, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=n, length_penalty=length_penalty,
        max_len_a=0.0, max_len_b=9,
    )  # fmt: skip


@pytest.mark.parametrize("length_penalty", [0.6, 1.0])
def test_teacher_forced_scores_are_the_beams_own(length_penalty: float) -> None:
    """Every one of the n best hypotheses of padded sources, and of an ensemble: the score and the
    summed log-probability the beam computed step by step with its cache, to rounding."""
    model = model_of(0)
    src = sources(torch.Generator().manual_seed(1))
    lengths = set()
    for decoder in (model, Ensemble([model, model_of(1)])):
        hyps = n_best(decoder, src, length_penalty)
        rows = [i for i, h in enumerate(hyps) for _ in h]
        flat = [h for sentence in hyps for h in sentence]
        scores = sequence_scores(decoder, src[rows], [h.tokens for h in flat], bos_id=BOS, length_penalty=0.0)
        assert scores == pytest.approx([h.log_prob for h in flat], abs=1e-5)
        normalised = sequence_scores(
            decoder, src[rows], [h.tokens for h in flat], bos_id=BOS, length_penalty=length_penalty
        )
        assert normalised == pytest.approx([h.score for h in flat], abs=1e-5)
        lengths |= {len(h.tokens) for h in flat}
    assert len(lengths) > 1  # hypotheses of several lengths
    as_lists = [[t for t in row if t != PAD] for row in src.tolist()]  # token lists: padded here
    best = [h[0].tokens for h in n_best(model, src, 1.0)]
    assert sequence_scores(model, as_lists, best, bos_id=BOS) == pytest.approx(
        sequence_scores(model, src, best, bos_id=BOS), abs=1e-6
    )
    assert sequence_score(model, as_lists[1], best[1], bos_id=BOS) == pytest.approx(
        sequence_scores(model, src, best, bos_id=BOS)[1], abs=1e-6
    )


def twin_tokens(model, a: int, b: int):
    """A copy of ``model`` for which target tokens a and b are the same (embedding and output row):
    any output scores exactly as with a and b swapped, a real tie."""
    twin = copy.deepcopy(model)
    twin.config.share_embeddings = False
    with torch.no_grad():
        twin.tgt_embed = copy.deepcopy(model.tgt_embed)
        twin.generator = copy.deepcopy(model.generator)
        twin.tgt_embed.weight[b] = twin.tgt_embed.weight[a]
        twin.generator.weight[b] = twin.generator.weight[a]
        if twin.generator.bias is not None:
            twin.generator.bias[b] = twin.generator.bias[a]
    return twin


def test_a_tie_passes_and_a_changed_token_fails() -> None:
    model = model_of(0)
    src = sources(torch.Generator().manual_seed(1))
    ours = [h[0].tokens for h in n_best(model, src, 1.0)]
    assert same_up_to_ties(model, src, ours, ours, bos_id=BOS).ok  # identical
    a, b = 7, 8
    twin = twin_tokens(model, a, b)
    line = max(range(len(ours)), key=lambda i: len(ours[i]))
    tied = copy.deepcopy(ours)
    tied[line] = [*ours[line][:-1], a, EOS]
    theirs = copy.deepcopy(tied)
    theirs[line][-2] = b  # the same output with b for a: the twin model cannot tell them apart
    report = same_up_to_ties(twin, src, tied, theirs, bos_id=BOS)
    assert report.ok and report.identical == 3 and [d.line for d in report.tied] == [line]
    assert report.tied[0].gap < 1e-6 and report.share == 1.0
    # mutation: a changed token (a real difference) fails, and the message names the line and scores
    changed = copy.deepcopy(ours)
    changed[line][0] = 3 if ours[line][0] != 3 else 4
    report = same_up_to_ties(model, src, ours, changed, bos_id=BOS, length_penalty=1.0)
    assert not report.ok and [d.line for d in report.different] == [line] and report.share == 0.75
    d = report.different[0]
    assert d.gap > 100 * TIE_TOLERANCE
    assert d.ours_score == pytest.approx(sequence_scores(model, src[[line]], [ours[line]], bos_id=BOS)[0])
    text = report.describe(lambda ids: " ".join(f"w{i}" for i in ids))
    assert text.startswith("3 of 4 lines identical, 0 tied within 0.0001")
    assert f"line {line} (DIFFERENT" in text
    assert f"{d.ours_score:.6f}" in text and f"{d.theirs_score:.6f}" in text
    # the beam's second best is not a tie of its best: only a tolerance above their gap says so
    first, second = n_best(model, src[[line]], 1.0, 2)[0]
    gap = first.score - second.score
    assert gap > 0
    best, swapped = copy.deepcopy(ours), copy.deepcopy(ours)
    best[line], swapped[line] = first.tokens, second.tokens
    assert not same_up_to_ties(model, src, best, swapped, bos_id=BOS, tolerance=gap / 2).ok
    assert same_up_to_ties(model, src, best, swapped, bos_id=BOS, tolerance=gap * 2).ok


def test_bad_arguments_are_named() -> None:
    model = model_of(0)
    src = sources(torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="as many outputs as sources, got 3 and 4 for 4"):
        same_up_to_ties(model, src, [[EOS]] * 3, [[EOS]] * 4, bos_id=BOS)
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        same_up_to_ties(model, src, [[EOS]] * 4, [[EOS]] * 4, bos_id=BOS, tolerance=-1.0)
    with pytest.raises(ValueError, match="empty hypothesis"):
        sequence_scores(model, src, [[EOS], [], [EOS], [EOS]], bos_id=BOS)
    with pytest.raises(ValueError, match="one hypothesis per source"):
        sequence_scores(model, src, [[EOS]], bos_id=BOS)
