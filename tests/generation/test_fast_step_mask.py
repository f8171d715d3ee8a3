"""The fast step's additive form of the padding mask (generation/fast_step.py: 0 where the bool mask
is True, -inf where False) is the bool mask's rule, the fully masked row included: a source of
padding only attends to nothing and gets zeros (docs/masks.md), so the fast search decodes it as the
reference does instead of stopping on NaN logits."""

from __future__ import annotations

import torch

from scratchformer.generation import beam_search
from scratchformer.generation.fast_beam import fast_beam_search
from scratchformer.generation.fast_step import DecoderStep
from tests.generation.test_fast_beam import BOS, EOS, PAD, padded_sources, sharp_model


def test_the_step_equals_decode_on_padded_sources() -> None:
    """Logits of the fast step and of the model's decode (bool masks) for the same tokens, the
    sentences padded to different lengths and one of padding only."""
    model, src = sharp_model(7, False), padded_sources(7)
    src[2] = PAD
    mask = model.source_padding_mask(src)
    with torch.no_grad():
        memory = model.encode(src, mask)
        step = DecoderStep(model, memory, mask, len(src), 4)
        tokens = torch.tensor([[BOS, 5, 9, 11]]).repeat(len(src), 1)
        expected = model.decode(tokens, memory, mask)  # (B, 4, V)
        for t in range(tokens.shape[1]):
            torch.testing.assert_close(step(tokens[:, t : t + 1], t, 1), expected[:, t], rtol=1e-4, atol=1e-3)


def test_a_source_of_padding_only_decodes_as_the_reference() -> None:
    model, src = sharp_model(8, True), padded_sources(8)
    src[1] = PAD
    options = dict(bos_id=BOS, eos_id=EOS, beam_size=3, n_best=2)
    reference, ours = beam_search(model, src, **options), fast_beam_search(model, src, **options)
    assert [[h.tokens for h in x] for x in ours] == [[h.tokens for h in x] for x in reference]
