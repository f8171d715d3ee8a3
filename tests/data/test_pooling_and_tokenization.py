"""Pooling over real tokens only, and the tokenizer wrapper on a tiny tokenizer built here."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

import scratchformer as sf


def test_masked_mean_ignores_padding_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 8, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    pooled = sf.masked_mean(hidden, mask)
    assert torch.allclose(pooled[1], hidden[1, 0])
    assert torch.allclose(pooled[0], hidden[0, :3].mean(0))
    # Appending more padding (with garbage vectors) changes nothing.
    longer = torch.cat([hidden, 1e3 * torch.randn(3, 4, 8, generator=gen)], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    assert (sf.masked_mean(longer, longer_mask) - pooled).abs().max().item() <= 1e-6
    # An all-padding row is zeros, not NaN.
    assert torch.all(sf.masked_mean(hidden[:1], torch.zeros(1, 5, dtype=torch.bool)) == 0)


def test_pool_modes_and_normalisation() -> None:
    hidden = torch.randn(2, 4, 6)
    mask = torch.ones(2, 4, dtype=torch.bool)
    assert torch.equal(sf.pool(hidden, mask, "cls"), hidden[:, 0])
    unit = sf.pool(hidden, mask, "mean", normalize=True)
    assert torch.allclose(unit.norm(dim=1), torch.ones(2))
    with pytest.raises(ValueError, match="pooling mode"):
        sf.pool(hidden, mask, "max")


@pytest.fixture()
def tiny_tokenizer() -> sf.TextTokenizer:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "b": 5, "c": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return sf.TextTokenizer(tok, max_length=5)


def test_tokenizer_pads_to_longest_and_truncates(tiny_tokenizer) -> None:
    batch = tiny_tokenizer(["a b", "c", "a b c a b c"])
    assert tiny_tokenizer.pad_id == 0
    assert batch.ids.tolist() == [[2, 4, 5, 3, 0], [2, 6, 3, 0, 0], [2, 4, 5, 6, 3]]
    assert batch.padding_mask.tolist()[1] == [True, True, True, False, False]
    assert batch.ids.dtype == torch.long and batch.padding_mask.dtype == torch.bool
    assert tiny_tokenizer(["zzz"]).ids.tolist() == [[2, 1, 3]]  # unknown word


def test_tokenizer_rejects_a_bare_string_and_empty_batch(tiny_tokenizer, tmp_path) -> None:
    with pytest.raises(TypeError, match="not one string"):
        tiny_tokenizer("a b")
    with pytest.raises(ValueError, match="at least one text"):
        tiny_tokenizer([])
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        sf.TextTokenizer.from_file(tmp_path / "missing.json", 8)
    path = tmp_path / "tok.json"
    tiny_tokenizer.save(path)
    assert sf.TextTokenizer.from_file(path, 5)(["a"]).ids.tolist() == [[2, 4, 3]]
