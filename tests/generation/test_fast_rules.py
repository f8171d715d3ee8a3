"""Every decoding rule runs inside the fast beam search's candidate step (generation/fast_beam.py) and
gives the reference's hypotheses (generation/beam.py) up to ties, on random sharp models, several
seeds, beam sizes and n_best; a fast step without one rule fails that check; ``generate`` takes
the fast path under every rule, and says why where it does not (an ensemble)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from scratchformer.generation import Ensemble, GenerationConfig, StepRules, beam_search, generate
from scratchformer.generation import fast_beam as fast
from scratchformer.generation.fast_beam import fast_beam_search, reference_reason
from scratchformer.generation.scoring import TIE_TOLERANCE
from tests.generation.test_fast_beam import BOS, EOS, PAD, padded_sources, sharp_model

NEW_TOKENS = 16
EOS_BIAS = 10.0
RULES = {  # each rule, set so that it changes the outputs of these models
    "prefix": {},
    "repetition_penalty": {"repetition_penalty": 3.0},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
    "min_new_tokens": {"min_new_tokens": 12},
}
OFF = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0}


def prefixes(seed: int, batch: int) -> list[list[int]]:
    """A forced prefix of 0 to 3 tokens per sentence (different lengths: different ends)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 40, (i % 4,), generator=gen).tolist() for i in range(batch)]


def make_rules(kinds: tuple[str, ...], seed: int, batch: int) -> StepRules:
    options = {key: value for kind in kinds for key, value in RULES[kind].items()}
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, **options)
    forced = prefixes(seed, batch) if "prefix" in kinds else [[]] * batch
    return StepRules(config, PAD, forced, NEW_TOKENS)


def without(rules: StepRules, kind: str) -> StepRules:
    """A copy of ``rules`` with one rule switched off (the mutation)."""
    mutated = copy.copy(rules)
    if kind == "prefix":
        mutated.prefix = torch.full_like(rules.prefix, -1)
    else:
        mutated.config = rules.config.replace(**{kind: OFF[kind]})
    return mutated


@torch.no_grad()
def rule_score(model, src: torch.Tensor, i: int, hyp: list[int], rules: StepRules, penalty: float) -> float:
    """Sentence i's hypothesis teacher-forced: its log-probabilities as the rules leave them, summed
    and normalised as the beam ranks it; -inf where a rule forbids one of its tokens."""
    tgt = torch.tensor([[BOS, *hyp[:-1]]])
    log_probs = torch.log_softmax(model(src[i : i + 1], tgt).float(), dim=-1)[0]  # (T, V)
    total = 0.0
    for t, token in enumerate(hyp):
        total += float(rules(log_probs[t : t + 1], tgt[:, : t + 1], t, torch.tensor([i]))[0, token])
    return total / len(hyp) ** penalty


def assert_parity(model, src, rules: StepRules, reference, ours, penalty: float) -> None:
    """Every rank of every sentence: the same tokens (scores and log-probabilities within 2e-4
    relative or 1e-4: fp32 rounding of another order of adding; measured on these models up to
    5.3e-5 under the plain rules, before this search applied the rules as after, and 1e-4 under
    them), or a tie: both allowed by the rules and scoring, under them, within the tie tolerance.
    The best of each sentence the same for all but one."""
    assert [len(h) for h in ours] == [len(h) for h in reference]
    for i, (theirs, mine) in enumerate(zip(reference, ours)):
        for h, g in zip(theirs, mine):
            if h.tokens == g.tokens:
                assert g.score == pytest.approx(h.score, rel=2e-4, abs=1e-4), (i, h, g)
                assert g.log_prob == pytest.approx(h.log_prob, rel=2e-4, abs=1e-4), (i, h, g)
                continue
            a, b = (rule_score(model, src, i, x.tokens, rules, penalty) for x in (h, g))
            assert math.isfinite(b) and abs(a - b) <= TIE_TOLERANCE, (i, h, g, a, b)
    assert sum(h[0].tokens == g[0].tokens for h, g in zip(reference, ours)) >= len(src) - 1


def search_both(seed: int, kinds: tuple[str, ...], beam_size: int, n_best: int, penalty: float):
    model, src = sharp_model(seed, norm_first=seed % 2 == 1), padded_sources(seed)
    with torch.no_grad():
        model.generator.bias[EOS] += EOS_BIAS  # some outputs end early: the minimum length bites
    rules = make_rules(kinds, seed, len(src))
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=beam_size, n_best=n_best, length_penalty=penalty)
    reference = beam_search(model, src, rules=rules, **options)
    return model, src, rules, reference, fast_beam_search(model, src, rules=rules, **options)


@pytest.mark.parametrize("kinds", [(kind,) for kind in RULES] + [tuple(RULES)], ids=[*RULES, "all"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("beam_size", "n_best"), [(1, 1), (3, 1), (4, 4)])
def test_each_rule_fast_equals_the_reference(kinds, seed: int, beam_size: int, n_best: int) -> None:
    penalty = (1.0, 0.6, 0.0)[seed]
    model, src, rules, reference, ours = search_both(seed, kinds, beam_size, n_best, penalty)
    assert_parity(model, src, rules, reference, ours, penalty)


@pytest.mark.parametrize("kind", list(RULES))
def test_a_fast_step_without_the_rule_fails_the_check(monkeypatch, kind: str) -> None:
    """The mutation: the fast search's candidate step with one rule switched off (the reference
    keeps it) gives other hypotheses, and the parity check says so on at least one setting."""
    original = fast.BeamState.__init__

    def mutated(self, B, k, rules, length_penalty, device):
        original(self, B, k, without(rules, kind), length_penalty, device)

    monkeypatch.setattr(fast.BeamState, "__init__", mutated)
    caught = 0
    for seed in (0, 1, 2):
        model, src, rules, reference, ours = search_both(seed, (kind,), 3, 3, 1.0)
        try:
            assert_parity(model, src, rules, reference, ours, 1.0)
        except AssertionError:
            caught += 1
    assert caught == 3


def test_generate_takes_the_fast_path_under_every_rule(monkeypatch) -> None:
    """generate with a prefix, a penalty, banned n-grams and a minimum length: the fast step runs and
    the reference never does."""
    steps, reference = [], []
    step = fast.DecoderStep.__call__
    monkeypatch.setattr(fast.DecoderStep, "__call__", lambda self, *a: steps.append(1) or step(self, *a))
    monkeypatch.setattr(fast, "beam_search", lambda *a, **k: reference.append(1) or beam_search(*a, **k))
    model, src = sharp_model(3, False), padded_sources(3)
    options = {key: value for rule in RULES.values() for key, value in rule.items()}
    config = GenerationConfig(
        decoder_start_token_id=BOS, eos_token_id=EOS, num_beams=3, num_return_sequences=2, **options
    )
    hyps = generate(model, src, config, prefix=prefixes(3, len(src)))
    assert steps and not reference
    assert [len(h) for h in hyps] == [2] * len(src)
    assert all(h.tokens[: len(p)] == p for h, p in zip((x[0] for x in hyps), prefixes(3, len(src))))


def test_generate_says_why_an_ensemble_runs_the_reference(monkeypatch) -> None:
    reference = []
    monkeypatch.setattr(fast, "beam_search", lambda *a, **k: reference.append(1) or beam_search(*a, **k))
    ensemble = Ensemble([sharp_model(4, False), sharp_model(5, False)])
    assert "Ensemble" in str(reference_reason(ensemble))
    generate(
        ensemble,
        padded_sources(4),
        GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, num_beams=2),
    )
    assert reference == [1]
