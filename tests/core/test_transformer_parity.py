"""The whole encoder-decoder == torch.nn.Transformer with the same weights.

The reference wraps ``nn.Transformer`` in what the paper puts around it: ``nn.Embedding`` times
sqrt(D), the positional table computed from the paper's formula with the ``math`` module, and an
``nn.Linear`` output layer.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    TOL,
    backward_with,
    copy_into_reference,
    decoder_layer_pairing,
    encoder_layer_pairing,
    linear_pairing,
    max_diff,
    max_grad_diff,
    norm_pairing,
    paper_positional_table,
    randomize_norms,
)
from torch import nn

import scratchformer as sf

PAD = 0


class Reference(nn.Module):
    def __init__(self, c: sf.TransformerConfig):
        super().__init__()
        self.d_model = c.d_model
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=PAD)
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=PAD)
        )
        self.transformer = nn.Transformer(
            c.d_model,
            c.num_heads,
            c.num_encoder_layers,
            c.num_decoder_layers,
            c.d_ff,
            dropout=0.0,
            activation=c.activation,
            batch_first=True,
            norm_first=c.norm_first,
        )
        if not (c.norm_first if c.final_norm is None else c.final_norm):
            self.transformer.encoder.norm = None  # nn.Transformer always adds one; the paper has none
            self.transformer.decoder.norm = None
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=not c.tie_output)
        if c.tie_output:
            self.generator.weight = self.tgt_embed.weight
        self.register_buffer("pe", paper_positional_table(c.max_len, c.d_model).float())

    def forward(self, src, tgt, src_pad, tgt_pad):
        scale = math.sqrt(self.d_model)
        s = self.src_embed(src) * scale + self.pe[: src.shape[1]]
        t = self.tgt_embed(tgt) * scale + self.pe[: tgt.shape[1]]
        causal_blocked = torch.triu(torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool), diagonal=1)
        h = self.transformer(
            s,
            t,
            tgt_mask=causal_blocked,
            src_key_padding_mask=~src_pad,
            tgt_key_padding_mask=~tgt_pad,
            memory_key_padding_mask=~src_pad,
        )
        return self.generator(h)


def pairing(ours: sf.Transformer, ref: Reference) -> list:
    c = ours.config
    pairs = [([ours.src_embed.weight], ref.src_embed.weight)]
    if not c.share_embeddings:
        pairs.append(([ours.tgt_embed.weight], ref.tgt_embed.weight))
    if not c.tie_output:
        pairs += linear_pairing(ours.generator, ref.generator)
    for mine, theirs in zip(ours.encoder.layers, ref.transformer.encoder.layers):
        pairs += encoder_layer_pairing(mine, theirs)
    for mine, theirs in zip(ours.decoder.layers, ref.transformer.decoder.layers):
        pairs += decoder_layer_pairing(mine, theirs)
    if ours.encoder.norm is not None:
        pairs += norm_pairing(ours.encoder.norm, ref.transformer.encoder.norm)
        pairs += norm_pairing(ours.decoder.norm, ref.transformer.decoder.norm)
    return pairs


VARIANTS = {
    "postLN-paper": dict(norm_first=False),
    "postLN-final-norm": dict(norm_first=False, final_norm=True),
    "preLN-gelu": dict(norm_first=True, activation="gelu"),
    "shared-tied": dict(share_embeddings=True, tie_output=True),
}


def build(variant: str, seed: int = 0) -> tuple[sf.Transformer, Reference, list]:
    torch.manual_seed(seed)
    same_vocab = VARIANTS[variant].get("share_embeddings", False)
    cfg = sf.TransformerConfig(
        src_vocab_size=19 if same_vocab else 23,
        tgt_vocab_size=19,
        d_model=32,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=64,
        pad_id=PAD,
        **VARIANTS[variant],
    )
    ours = sf.Transformer(cfg).eval()
    randomize_norms(ours)
    ref = Reference(cfg).eval()
    pairs = pairing(ours, ref)
    copy_into_reference(pairs)
    return ours, ref, pairs


def padded_tokens(batch: int, length: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    tokens = torch.randint(1, vocab, (batch, length), generator=gen)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    tokens[torch.arange(length)[None, :] >= lengths[:, None]] = PAD
    return tokens


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformer_matches_torch(variant: str) -> None:
    ours, ref, pairs = build(variant)
    gen = torch.Generator().manual_seed(5)
    src = padded_tokens(4, 9, ours.config.src_vocab_size, gen)
    tgt = padded_tokens(4, 7, ours.config.tgt_vocab_size, gen)

    logits = ours(src, tgt, tgt_padding_mask=tgt != PAD)  # source padding mask derived from pad_id
    assert logits.shape == (4, 7, ours.config.tgt_vocab_size)
    ref_logits = ref(src, tgt, src != PAD, tgt != PAD)
    assert max_diff(logits, ref_logits) <= TOL

    backward_with(logits)
    backward_with(ref_logits)
    assert max_grad_diff(pairs) <= TOL


def test_target_padding_mask_changes_nothing_at_real_positions() -> None:
    """With right padding the causal mask already hides padding from every real position."""
    ours, _, _ = build("postLN-paper")
    gen = torch.Generator().manual_seed(8)
    src, tgt = padded_tokens(4, 9, 23, gen), padded_tokens(4, 7, 19, gen)
    assert (tgt == PAD).any()
    real = (tgt != PAD)[..., None]
    with_mask, without = ours(src, tgt, tgt_padding_mask=tgt != PAD), ours(src, tgt)
    assert max_diff(with_mask * real, without * real) <= 1e-6


def test_encode_decode_equal_forward() -> None:
    ours, _, _ = build("postLN-paper")
    gen = torch.Generator().manual_seed(6)
    src, tgt = padded_tokens(2, 8, 23, gen), padded_tokens(2, 5, 19, gen)
    memory = ours.encode(src)
    assert memory.shape == (2, 8, 32)
    assert max_diff(ours.decode(tgt, memory, src != PAD), ours(src, tgt)) == 0.0


def test_shared_and_tied_weights_are_one_tensor() -> None:
    ours, _, _ = build("shared-tied")
    assert ours.src_embed is ours.tgt_embed
    assert ours.generator.weight is ours.tgt_embed.weight
    assert ours.generator.bias is None
    # Shared matrices are counted once.
    assert ours.num_parameters() == sum(p.numel() for p in ours.parameters())


def test_learned_positions_model_runs_and_respects_max_len() -> None:
    cfg = sf.TransformerConfig(
        src_vocab_size=11,
        tgt_vocab_size=11,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        positional="learned",
        max_len=8,
    )
    model = sf.Transformer(cfg)
    assert model(torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long)).shape == (2, 8, 11)
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.ones(2, 9, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
