"""Shared test helpers: map our parameters onto torch.nn's reference modules.

A "pairing" is a list of (our tensors, reference tensor): the reference tensor equals our tensors
concatenated along dim 0. The same
pairing copies weights into the reference and compares gradients afterwards.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import scratchformer as sf

Pairing = list[tuple[list[Tensor], Tensor]]

TOL = 1e-5


def mha_pairing(ours: sf.MultiHeadAttention, ref: nn.MultiheadAttention) -> Pairing:
    return [
        ([ours.qkv_proj.weight], ref.in_proj_weight),  # [W^Q; W^K; W^V], both sides
        ([ours.qkv_proj.bias], ref.in_proj_bias),
        ([ours.out_proj.weight], ref.out_proj.weight),
        ([ours.out_proj.bias], ref.out_proj.bias),
    ]


def linear_pairing(ours: nn.Module, ref: nn.Module) -> Pairing:
    pairs = [([ours.weight], ref.weight)]
    if getattr(ours, "bias", None) is not None:
        pairs.append(([ours.bias], ref.bias))
    return pairs


def norm_pairing(ours: sf.LayerNorm, ref: nn.LayerNorm) -> Pairing:
    return [([ours.weight], ref.weight), ([ours.bias], ref.bias)]


def encoder_layer_pairing(ours: sf.EncoderLayer, ref: nn.TransformerEncoderLayer) -> Pairing:
    return (
        mha_pairing(ours.self_attn, ref.self_attn)
        + linear_pairing(ours.feed_forward.linear1, ref.linear1)
        + linear_pairing(ours.feed_forward.linear2, ref.linear2)
        + norm_pairing(ours.norm1, ref.norm1)
        + norm_pairing(ours.norm2, ref.norm2)
    )


def decoder_layer_pairing(ours: sf.DecoderLayer, ref: nn.TransformerDecoderLayer) -> Pairing:
    return (
        mha_pairing(ours.self_attn, ref.self_attn)
        + mha_pairing(ours.cross_attn, ref.multihead_attn)
        + linear_pairing(ours.feed_forward.linear1, ref.linear1)
        + linear_pairing(ours.feed_forward.linear2, ref.linear2)
        + norm_pairing(ours.norm1, ref.norm1)
        + norm_pairing(ours.norm2, ref.norm2)
        + norm_pairing(ours.norm3, ref.norm3)
    )


def randomize_norms(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """Give every LayerNorm a non-trivial gamma/beta so that their use is actually tested."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, sf.LayerNorm):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=generator))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=generator))


def copy_into_reference(pairing: Pairing) -> None:
    with torch.no_grad():
        for ours, ref in pairing:
            assert ref.shape == torch.cat(ours).shape, (ref.shape, [o.shape for o in ours])
            ref.copy_(torch.cat(ours))


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def max_grad_diff(pairing: Pairing) -> float:
    worst = 0.0
    for ours, ref in pairing:
        assert ref.grad is not None and all(o.grad is not None for o in ours)
        worst = max(worst, max_diff(torch.cat([o.grad for o in ours]), ref.grad))
    return worst


def backward_with(out: Tensor, seed: int = 123) -> None:
    """Backpropagate a fixed random projection of ``out``: a loss that weighs every element,
    averaged over positions (all dims but the last) as token-level losses are, so gradients
    have the scale they have in training."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    positions = out.numel() // out.shape[-1]
    ((out * g).sum() / positions).backward()


def paper_positional_table(length: int, d_model: int) -> Tensor:
    """The paper's formula, element by element with the math module: an independent reference."""
    table = torch.empty(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


def random_padding(batch: int, length: int, generator: torch.Generator) -> Tensor:
    """(B, L) bool, True at real tokens: random lengths 1..L, at least one row full length."""
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    lengths[0] = length
    return torch.arange(length)[None, :] < lengths[:, None]
