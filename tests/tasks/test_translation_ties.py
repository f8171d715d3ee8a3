"""Translations compared up to ties (tasks/translation/ties.py): identical texts pass unscored; a
changed word fails, with both texts tokenised back and scored by the model as its beam ranks them
(the decoding's length penalty; the scores themselves are checked against the beam's in
tests/generation/test_scoring.py)."""

from __future__ import annotations

import pytest
import torch
from tasks.test_translation import toy_pairs

from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.data.tokenization import train_bpe
from scratchformer.generation.scoring import sequence_scores
from scratchformer.tasks.translation import Translator
from scratchformer.tasks.translation.ties import same_translations_up_to_ties, target_ids


@pytest.fixture(scope="module")
def translator() -> Translator:
    """A random model: its translations run to the length limit, half the source's tokens and two."""
    sources, targets = toy_pairs(200, 0)
    tokenizer = train_bpe(sources + targets, 300)
    vocab = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    config = TransformerConfig(vocab, vocab, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1,
                               num_decoder_layers=1, dropout=0.0, max_len=32)  # fmt: skip
    model = Transformer(config).eval()
    decoding = {"beam_size": 3, "length_penalty": 0.6, "max_len_a": 0.5, "max_len_b": 2}
    return Translator(model, tokenizer, decoding, torch.device("cpu"))


def test_identical_passes_and_a_changed_word_fails(translator: Translator) -> None:
    texts = toy_pairs(6, 2)[0]
    ours = translator.translate(texts)
    report = same_translations_up_to_ties(translator, texts, ours, list(ours))
    assert report.ok and report.identical == 6 and not report.tied
    theirs = [*ours[:3], ours[3] + " dog", *ours[4:]]
    report = same_translations_up_to_ties(translator, texts, ours, theirs)
    assert (
        not report.ok and [d.line for d in report.different] == [3] and report.share == pytest.approx(5 / 6)
    )
    d = report.different[0]
    pair = target_ids(translator, [ours[3], theirs[3]])
    expected = sequence_scores(
        translator.model, translator.encode_sources(texts[3:4]) * 2, pair, bos_id=1, length_penalty=0.6
    )
    assert [d.ours_score, d.theirs_score] == pytest.approx(expected) and d.gap > 1e-3
    assert pair[0] == translator.tokenizer.encode(ours[3], add_special_tokens=False).ids + [translator.eos]
    assert "line 3 (DIFFERENT" in report.describe(translator.tokenizer.decode)
    with pytest.raises(ValueError, match="one translation per source, got 5 and 6 for 6"):
        same_translations_up_to_ties(translator, texts, ours[:5], ours)
