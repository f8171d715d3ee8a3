"""Checkpoint averaging: the element-wise mean, and tied weights stored once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import scratchformer as sf
from scratchformer.training.checkpoint import average_checkpoints, save_checkpoint


def test_average_of_checkpoints_is_the_mean_and_keeps_ties(tmp_path: Path) -> None:
    cfg = sf.TransformerConfig(
        src_vocab_size=20,
        tgt_vocab_size=20,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        share_embeddings=True,
        tie_output=True,
    )
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(sf.Transformer(cfg))
        save_checkpoint(tmp_path / f"c{seed}", models[-1], {"kind": "test"})
    target = sf.Transformer(cfg)
    average_checkpoints([tmp_path / f"c{i}" for i in range(3)], target)
    for name, p in target.named_parameters():
        mean = sum(dict(m.named_parameters())[name] for m in models) / 3
        assert torch.allclose(p, mean, atol=1e-6), name
    assert target.generator.weight is target.tgt_embed.weight  # still tied

    other = sf.Transformer(
        sf.TransformerConfig(
            src_vocab_size=20,
            tgt_vocab_size=20,
            d_model=16,
            num_heads=2,
            d_ff=64,
            num_encoder_layers=1,
            num_decoder_layers=1,
        )
    )
    with pytest.raises(Exception, match="size mismatch|does not fit"):
        average_checkpoints([tmp_path / "c0"], other)
