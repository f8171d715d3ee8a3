"""Positional encodings vs the paper's formula, token embedding scaling, and the mask helpers."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import max_diff, paper_positional_table

import scratchformer as sf


@pytest.mark.parametrize("d_model", [2, 16, 512])
def test_sinusoidal_table_matches_paper_formula(d_model: int) -> None:
    ours = sf.sinusoidal_table(300, d_model)
    assert ours.dtype == torch.float32
    assert max_diff(ours, paper_positional_table(300, d_model)) <= 1e-6


def test_sinusoidal_is_interleaved_not_concatenated() -> None:
    table = sf.sinusoidal_table(10, 8)
    # dimension 0 is sin(pos), dimension 1 is cos(pos): pos 0 gives 0, 1, 0, 1, ...
    assert table[0].tolist() == [0.0, 1.0] * 4
    assert table[3, 0].item() == pytest.approx(math.sin(3.0))
    assert table[3, 1].item() == pytest.approx(math.cos(3.0))


def test_sinusoidal_module_adds_table_and_extends_past_its_length() -> None:
    pe = sf.SinusoidalPositionalEncoding(16, max_len=8)
    x = torch.randn(2, 20, 16)  # longer than the table: extends, no index error
    y = pe(x)
    assert max_diff(y - x, paper_positional_table(20, 16)[None]) <= 1e-6
    # offset (incremental decoding): positions 20..22
    y2 = pe(torch.zeros(1, 3, 16), offset=20)
    assert max_diff(y2[0], paper_positional_table(23, 16)[20:]) <= 1e-6
    assert "table" not in pe.state_dict()  # a formula, not a weight
    with pytest.raises(ValueError, match="even d_model"):
        sf.SinusoidalPositionalEncoding(7)


def test_learned_positions_raise_past_their_table() -> None:
    pe = sf.LearnedPositionalEmbedding(max_len=6, d_model=4)
    assert pe(torch.zeros(1, 6, 4)).shape == (1, 6, 4)
    with pytest.raises(ValueError, match="max_len=6"):
        pe(torch.zeros(1, 7, 4))


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positions_per_row_start_each_row_at_its_own_offset(kind: str) -> None:
    """An offset (B,) gives row b the positions offset[b], offset[b] + 1, ...: what an int offset
    gives that row alone (a sentence joining a running batch at its own position), past the
    sinusoidal table's length too; a learned table still refuses positions it lacks."""
    torch.manual_seed(0)
    module = (
        sf.SinusoidalPositionalEncoding(8, max_len=6)
        if kind == "sinusoidal"
        else sf.LearnedPositionalEmbedding(12, 8)
    )
    x, offset = torch.randn(3, 2, 8), torch.tensor([0, 4, 9])
    rows = torch.cat([module(x[b : b + 1], int(offset[b])) for b in range(3)])
    assert torch.equal(module(x, offset), rows)
    if kind == "learned":
        with pytest.raises(ValueError, match="positions up to 13"):
            module(x, torch.tensor([0, 11, 2]))


def test_token_embedding_scales_by_sqrt_d_and_zeroes_padding() -> None:
    emb = sf.TokenEmbedding(10, 64, padding_idx=0)
    tokens = torch.tensor([[0, 3, 9]])
    out = emb(tokens)
    assert max_diff(out[0, 1], emb.weight[3] * 8.0) == 0.0
    assert torch.all(out[0, 0] == 0)
    unscaled = sf.TokenEmbedding(10, 64, scale=False)  # BERT-style
    assert max_diff(unscaled(tokens), unscaled.weight[tokens]) == 0.0


def test_padding_mask_true_at_real_tokens() -> None:
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    assert sf.padding_mask(tokens, pad_id=0).tolist() == [
        [True, True, False, False],
        [True, False, False, False],
    ]


def test_causal_mask_square_and_offset() -> None:
    assert sf.causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # Two new queries at the end of a 4-long sequence (decoding with a cache).
    assert sf.causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="T <= S"):
        sf.causal_mask(4, 2)


def test_combine_masks_is_logical_and_and_rejects_non_bool() -> None:
    pad = torch.tensor([[True, True, False]])  # (B, S)
    combined = sf.combine_masks(pad[:, None, :], sf.causal_mask(3), None)  # (B, T, S)
    assert combined.tolist() == [[[True, False, False], [True, True, False], [True, True, False]]]
    assert sf.combine_masks(None, None) is None
    with pytest.raises(TypeError, match="torch.bool"):
        sf.combine_masks(pad, torch.zeros(1, 3))
