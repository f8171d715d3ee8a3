"""The fast beam search (generation/fast_beam.py) gives the reference's hypotheses (generation/beam.py)
up to ties of rounding, while doing less: the first step at batch B, finished sentences out of the
batch, the encoder's keys/values never replicated across beams."""

from __future__ import annotations

import pytest
import torch

import scratchformer as sf
from scratchformer.generation import GenerationConfig, StepRules, beam_search, generate
from scratchformer.generation import fast_beam as fast
from scratchformer.generation.fast_beam import fast_beam_search, readable_beam_search, reference_reason
from scratchformer.generation.scoring import same_up_to_ties

PAD, BOS, EOS = 0, 1, 2


def sharp_model(seed: int, norm_first: bool, vocab: int = 40) -> sf.Transformer:
    """A random model with weights x3: peaked next-token distributions (not near-uniform, where
    every beam is a near tie), sentences that end at different steps."""
    torch.manual_seed(seed)
    config = sf.TransformerConfig(
        vocab, vocab, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
        dropout=0.0, pad_id=PAD, norm_first=norm_first, final_norm=norm_first, max_len=64,
    )  # fmt: skip
    model = sf.Transformer(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3.0)
    return model


def padded_sources(seed: int, lengths=(9, 3, 6, 1, 8, 5), vocab: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, vocab, (n,), generator=gen)
    return src


def assert_same_up_to_ties(model, src, reference, fast_hyps, length_penalty: float) -> None:
    """Every rank of every sentence: the same tokens, or a tie (our scores within 1e-4); equal
    hypotheses' scores and summed log-probabilities within 5e-5 relative or 1e-4: fp32 rounding of
    another order of adding (explicit attention against the fused kernel) on logits of magnitude up
    to ~100 (weights x3), about 1e-5 a step, summed over up to 30 steps."""
    assert [len(h) for h in fast_hyps] == [len(h) for h in reference]
    for rank in range(len(reference[0])):
        ours = [hyps[rank].tokens for hyps in reference]
        theirs = [hyps[rank].tokens for hyps in fast_hyps]
        report = same_up_to_ties(model, src, ours, theirs, bos_id=BOS, length_penalty=length_penalty)
        assert report.ok, report.describe()
    for a, b in zip(reference, fast_hyps):
        for h, g in zip(a, b):
            if h.tokens == g.tokens:
                assert g.score == pytest.approx(h.score, rel=5e-5, abs=1e-4)
                assert g.log_prob == pytest.approx(h.log_prob, rel=5e-5, abs=1e-4)


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
@pytest.mark.parametrize("beam_size", [1, 2, 5])
@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 1.0])
def test_fast_equals_the_reference(norm_first: bool, beam_size: int, length_penalty: float) -> None:
    model = sharp_model(beam_size, norm_first)
    src = padded_sources(beam_size)
    options = dict(
        bos_id=BOS, eos_id=EOS, beam_size=beam_size, length_penalty=length_penalty, n_best=beam_size
    )
    reference = beam_search(model, src, **options)
    fast_hyps = fast_beam_search(model, src, **options)
    assert_same_up_to_ties(model, src, reference, fast_hyps, length_penalty)
    exact = sum(a[0].tokens == b[0].tokens for a, b in zip(reference, fast_hyps))
    assert exact >= len(src) - 1  # ties are rare on a peaked model: a changed search is not one


def test_the_batch_shrinks_and_the_memory_is_not_replicated(monkeypatch) -> None:
    """Rows decoded per step: B at the first step, B x k next, fewer as sentences finish; the
    cross-attention's keys/values have one group of H heads per live sentence, never one per beam."""
    model, src, k = sharp_model(0, False), padded_sources(0), 4
    seen: list[tuple[int, int]] = []
    step = fast.DecoderStep.__call__

    def recording(self, tokens, t, beams):
        seen.append((tokens.shape[0], self.memory_kv[0][0].shape[0] // model.config.num_heads))
        return step(self, tokens, t, beams)

    monkeypatch.setattr(fast.DecoderStep, "__call__", recording)
    fast_beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=k)
    B = len(src)
    assert seen[0] == (B, B) and seen[1] == (B * k, B)
    assert all(rows == sentences * k for rows, sentences in seen[1:])
    assert seen[-1][1] < B  # some sentences finished early and left the batch
    assert [rows for rows, _ in seen[1:]] == sorted((rows for rows, _ in seen[1:]), reverse=True)


def test_a_vocabulary_smaller_than_the_beam() -> None:
    model = sharp_model(3, False, vocab=6)
    src = padded_sources(3, vocab=6)
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=5, length_penalty=1.0, n_best=5)
    assert_same_up_to_ties(
        model, src, beam_search(model, src, **options), fast_beam_search(model, src, **options), 1.0
    )


def test_every_rule_runs_fast_and_other_models_the_reference(monkeypatch) -> None:
    """A prefix, a penalty, banned n-grams or a minimum length: the fast search, with the
    reference's hypotheses (each rule in depth: test_fast_rules.py); a model in training mode: the
    reference, with its result, and reference_reason says why."""
    model, src = sharp_model(1, True), padded_sources(1)
    plain = StepRules.plain(BOS, EOS, PAD, len(src), 20)
    assert reference_reason(model) is None
    calls = []
    step = fast.DecoderStep.__call__
    monkeypatch.setattr(fast.DecoderStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    prefixed = StepRules(GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS), PAD, [[5]] * 6, 20)
    for options in ({"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 2}, {"min_new_tokens": 3}, None):
        rules = prefixed if options is None else StepRules.plain(BOS, EOS, PAD, len(src), 20, **options)
        calls.clear()
        ours = fast_beam_search(model, src, bos_id=BOS, eos_id=EOS, rules=rules)
        reference = beam_search(model, src, bos_id=BOS, eos_id=EOS, rules=rules)
        assert calls and [h[0].tokens for h in ours] == [h[0].tokens for h in reference]
    trained = model.train()
    assert "training mode" in str(reference_reason(trained))
    calls.clear()
    with pytest.warns(UserWarning, match="training mode"):
        ours = fast_beam_search(trained, src, bos_id=BOS, eos_id=EOS, rules=plain)
        assert ours == beam_search(trained, src, bos_id=BOS, eos_id=EOS, rules=plain)
    assert not calls


def test_generate_and_the_captioner_decode_with_it(monkeypatch) -> None:
    """generate(num_beams > 1) runs the fast search; a CaptioningTransformer (image regions as the
    memory) gives the reference's captions with it."""
    calls = []
    step = fast.DecoderStep.__call__
    monkeypatch.setattr(fast.DecoderStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    model, src = sharp_model(2, False), padded_sources(2)
    config = GenerationConfig(
        decoder_start_token_id=BOS, eos_token_id=EOS, num_beams=3, num_return_sequences=3
    )
    hyps = generate(model, src, config)
    assert calls and [[h.tokens for h in x] for x in hyps] == [
        [h.tokens for h in x]
        for x in beam_search(
            model,
            src,
            bos_id=BOS,
            eos_id=EOS,
            beam_size=3,
            n_best=3,
            max_len_a=config.max_len_a,
            max_len_b=config.max_len_b,
        )
    ]
    torch.manual_seed(0)
    captioner = sf.CaptioningTransformer(
        sf.CaptioningConfig(
            vocab_size=30,
            input="features",
            feature_dim=12,
            d_model=32,
            num_heads=4,
            d_ff=64,
            num_encoder_layers=1,
            num_decoder_layers=2,
            dropout=0.0,
            pad_id=PAD,
        )
    ).eval()
    with torch.no_grad():
        for parameter in captioner.decoder.parameters():
            parameter.mul_(3.0)
    images = torch.randn(5, 7, 12)
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=4, n_best=2)
    reference = beam_search(captioner, images, **options)
    calls.clear()
    captions = fast_beam_search(captioner, images, **options)
    assert calls and [[h.tokens for h in x] for x in captions] == [[h.tokens for h in x] for x in reference]


def test_weights_changed_in_place_or_made_in_inference_mode() -> None:
    """The kept W^T follows a weight changed in place (its version), and a model built under
    torch.inference_mode (weights without a version) decodes as the reference."""
    model, src = sharp_model(4, False), padded_sources(4)
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=3, n_best=3)
    fast_beam_search(model, src, **options)  # W^T kept
    with torch.no_grad():
        model.generator.weight.mul_(-1.0)  # the output projection reversed: other translations
    tokens = [[h.tokens for h in x] for x in fast_beam_search(model, src, **options)]
    assert tokens == [[h.tokens for h in x] for x in beam_search(model, src, **options)]
    with torch.inference_mode():
        frozen = sharp_model(5, True)
        ours = fast_beam_search(frozen, src, **options)
        assert [[h.tokens for h in x] for x in ours] == [
            [h.tokens for h in x] for x in beam_search(frozen, src, **options)
        ]


def test_readable_beam_search_switches_generate_to_the_reference(monkeypatch) -> None:
    """Within readable_beam_search(), generate decodes by beam_search (no fast step runs); after
    it, by the fast search again."""
    calls = []
    step = fast.DecoderStep.__call__
    monkeypatch.setattr(fast.DecoderStep, "__call__", lambda self, *a: calls.append(1) or step(self, *a))
    model, src = sharp_model(6, False), padded_sources(6)
    config = GenerationConfig(decoder_start_token_id=BOS, eos_token_id=EOS, num_beams=3)
    with readable_beam_search():
        readable = generate(model, src, config)
    assert calls == []
    fast_hyps = generate(model, src, config)
    assert calls and [x[0].tokens for x in readable] == [x[0].tokens for x in fast_hyps]


def test_the_step_products_follow_autocast() -> None:
    """In fp32 a step multiplies by oneDNN's packed GEMM (where torch has it), equal to the linear
    map up to rounding; under autocast it leaves the product to autocast (bf16 rows), and a search
    under autocast runs to the end."""
    from torch.nn import functional as F

    from scratchformer.generation.fast_step import affine

    torch.manual_seed(0)
    linear, x = torch.nn.Linear(32, 48), torch.randn(5, 32)
    with torch.inference_mode():
        assert torch.allclose(affine(linear)(x), F.linear(x, linear.weight, linear.bias), atol=1e-5)
        assert torch.allclose(affine(linear, relu=True)(x), F.relu(linear(x)), atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert affine(linear)(x).dtype == torch.bfloat16
    model, src = sharp_model(2, True), padded_sources(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hyps = fast_beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3)
    assert len(hyps) == len(src) and all(h and h[0].tokens[-1] == EOS for h in hyps)


def test_int8_one_sentence_at_a_time() -> None:
    """An int8 model (dynamic quantization: the input of each product quantized with one scale per
    call) decodes as the reference: for one sentence both search the same rows, so each product
    sees the same input (batches would differ: finished sentences leave the fast search's batch,
    and the scale with them)."""
    from scratchformer.fast.quantized import quantize_int8

    model = quantize_int8(sharp_model(4, True))
    src = padded_sources(4)
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=4, length_penalty=1.0, n_best=2)
    for row in src:
        one = row[row != PAD][None]
        reference = beam_search(model, one, **options)
        assert_same_up_to_ties(model, one, reference, fast_beam_search(model, one, **options), 1.0)
