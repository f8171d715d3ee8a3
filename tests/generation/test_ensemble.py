"""Ensembles decode as one model: an ensemble of one is the model, two identical models are one (the
same outputs up to ties: a differing one must score within 1e-4 by the model, generation/scoring.py),
and two different models give the mean of their log-probabilities, with the cache as without it, for
captioners (same or packed inputs) and translators (padded sources)."""

from __future__ import annotations

import copy

import pytest
import torch

from scratchformer import CaptioningConfig, CaptioningTransformer, Transformer, TransformerConfig
from scratchformer.generation import GenerationConfig, generate, greedy_decode
from scratchformer.generation.ensemble import Ensemble
from scratchformer.generation.scoring import same_up_to_ties

V = 12


def captioner(seed: int, **overrides) -> CaptioningTransformer:
    torch.manual_seed(seed)
    args = {
        "vocab_size": V,
        "input": "features",
        "feature_dim": 8,
        "num_regions": 4,
        "d_model": 32,
        "num_heads": 2,
        "d_ff": 64,
        "num_encoder_layers": 1,
        "num_decoder_layers": 2,
        "dropout": 0.0,
        "max_len": 10,
    }
    return CaptioningTransformer(CaptioningConfig(**{**args, **overrides})).eval()


def decoded(model, src, **options) -> list[list[tuple[list[int], float, float]]]:
    config = GenerationConfig(decoder_start_token_id=1, eos_token_id=2, max_len_a=0.0, max_len_b=8, **options)
    return [[(h.tokens, h.log_prob, h.score) for h in hyps] for hyps in generate(model, src, config)]


def assert_same(a, b, model, src) -> None:
    """The same hypotheses up to ties (``model`` scores a differing pair within 1e-4), with the same
    scores, and the same log-probabilities where the tokens are the same."""
    assert [len(s) for s in a] == [len(s) for s in b]
    rows = [i for i, s in enumerate(a) for _ in s]
    ours, theirs = [h[0] for s in a for h in s], [h[0] for s in b for h in s]
    report = same_up_to_ties(model, src[rows], ours, theirs, bos_id=1, length_penalty=1.0)
    assert report.ok, report.describe()
    for x, y in zip(a, b):
        for (t1, lp1, s1), (t2, lp2, s2) in zip(x, y):
            assert s1 == pytest.approx(s2, abs=1e-4)
            assert t1 != t2 or (lp1 == pytest.approx(lp2, abs=1e-5) and s1 == pytest.approx(s2, abs=1e-5))


@pytest.mark.parametrize("options", [{"num_beams": 1}, {"num_beams": 3, "num_return_sequences": 2}])
def test_an_ensemble_of_one_is_the_model_and_two_identical_models_are_one(options) -> None:
    model, src = captioner(0), torch.randn(5, 4, 8)
    single = decoded(model, src, **options)
    assert_same(decoded(Ensemble([model]), src, **options), single, model, src)
    assert_same(decoded(Ensemble([model, copy.deepcopy(model)]), src, **options), single, model, src)
    sampled = {"do_sample": True, "num_return_sequences": 2}
    torch.manual_seed(3)
    one = decoded(model, src, **sampled)
    torch.manual_seed(3)
    assert_same(decoded(Ensemble([model, copy.deepcopy(model)]), src, **sampled), one, model, src)


def test_two_models_give_the_mean_of_their_log_probabilities_with_the_cache_as_without() -> None:
    a, b, src = captioner(0), captioner(1), torch.randn(4, 4, 8)
    tgt = torch.randint(3, V, (4, 6))
    expected = (a(src, tgt).log_softmax(-1) + b(src, tgt).log_softmax(-1)) / 2  # the independent reference
    ensemble = Ensemble([a, b])
    assert torch.allclose(ensemble(src, tgt), expected, atol=1e-5)
    cached = greedy_decode(ensemble, src, bos_id=1, eos_id=2, max_len_a=0, max_len_b=8)
    recomputed = greedy_decode(ensemble, src, bos_id=1, eos_id=2, max_len_a=0, max_len_b=8, use_cache=False)
    assert torch.equal(cached, recomputed)
    beams = decoded(ensemble, src, num_beams=3)
    memory = ensemble.encode(src)  # each beam's reported log-probability is the ensemble's
    torch.set_grad_enabled(False)
    for i, ((tokens, log_prob, _),) in enumerate(beams):
        steps = torch.tensor([[1] + tokens[:-1]])
        lp = ensemble.decode(steps, memory[i : i + 1]).log_softmax(-1)[0, range(len(tokens)), tokens].sum()
        assert float(lp) == pytest.approx(log_prob, abs=1e-4)
    torch.set_grad_enabled(True)


def test_a_different_member_fails_the_comparison() -> None:
    """Mutation: a second member that is another model is not the model, beyond ties."""
    model, src = captioner(0), torch.randn(5, 4, 8)
    single = decoded(model, src, num_beams=3)
    with pytest.raises(AssertionError, match=r"[1-9]\d* different"):
        assert_same(decoded(Ensemble([model, captioner(1)]), src, num_beams=3), single, model, src)


def test_members_of_different_inputs_read_them_packed() -> None:
    a, b = captioner(0), captioner(1, num_regions=9, feature_dim=6, d_model=16, num_decoder_layers=1)
    xa, xb, tgt = torch.randn(3, 4, 8), torch.randn(3, 9, 6), torch.randint(3, V, (3, 5))
    ensemble = Ensemble([a, b], input_shapes=[(4, 8), (9, 6)])
    packed = Ensemble.pack([xa, xb])
    assert packed.shape == (3, 4 * 8 + 9 * 6)
    expected = (a(xa, tgt).log_softmax(-1) + b(xb, tgt).log_softmax(-1)) / 2
    assert torch.allclose(ensemble(packed, tgt), expected, atol=1e-5)
    assert len(decoded(ensemble, packed, num_beams=2)) == 3
    with pytest.raises(ValueError, match=r"expected \(B, 86\) packed inputs"):
        ensemble.encode(xa)


def test_translators_with_padded_sources_ensemble_too() -> None:
    def translator(seed: int) -> Transformer:
        torch.manual_seed(seed)
        config = TransformerConfig(
            src_vocab_size=15, tgt_vocab_size=V, d_model=32, num_heads=2, d_ff=64,
            num_encoder_layers=1, num_decoder_layers=1, dropout=0.0, max_len=16, pad_id=0,
        )  # fmt: skip
        return Transformer(config).eval()

    a, b = translator(0), translator(1)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    assert_same(
        decoded(Ensemble([a, copy.deepcopy(a)]), src, num_beams=2), decoded(a, src, num_beams=2), a, src
    )
    tgt = torch.randint(3, V, (2, 5))
    expected = (a(src, tgt).log_softmax(-1) + b(src, tgt).log_softmax(-1)) / 2
    assert torch.allclose(Ensemble([a, b])(src, tgt), expected, atol=1e-5)


def test_members_of_another_vocabulary_are_refused() -> None:
    with pytest.raises(ValueError, match="share the target vocabulary"):
        Ensemble([captioner(0), captioner(1, vocab_size=V + 1)])
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])
