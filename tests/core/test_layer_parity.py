"""EncoderLayer / DecoderLayer / LayerNorm == their torch.nn counterparts (outputs and gradients)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    TOL,
    backward_with,
    copy_into_reference,
    decoder_layer_pairing,
    encoder_layer_pairing,
    max_diff,
    max_grad_diff,
    random_padding,
    randomize_norms,
)
from torch import nn

import scratchformer as sf

D, H, FF, B = 32, 4, 64, 3
VARIANTS = [(nf, act) for nf in (False, True) for act in ("relu", "gelu")]


def _ids(v: tuple[bool, str]) -> str:
    return f"{'pre' if v[0] else 'post'}LN-{v[1]}"


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_encoder_layer_matches_torch(variant: tuple[bool, str]) -> None:
    norm_first, activation = variant
    torch.manual_seed(0)
    ours = sf.EncoderLayer(D, H, FF, dropout=0.0, activation=activation, norm_first=norm_first).eval()
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    randomize_norms(ours)
    pairing = encoder_layer_pairing(ours, ref)
    copy_into_reference(pairing)

    gen = torch.Generator().manual_seed(1)
    S = 8
    x = torch.randn(B, S, D, generator=gen, requires_grad=True)
    kpm = random_padding(B, S, gen)

    out = ours(x, key_padding_mask=kpm)
    backward_with(out)
    x_grad = x.grad.clone()
    x.grad = None
    ref_out = ref(x, src_key_padding_mask=~kpm)
    backward_with(ref_out)

    assert max_diff(out, ref_out) <= TOL  # padded positions included
    assert max_diff(x_grad, x.grad) <= TOL
    assert max_grad_diff(pairing) <= TOL


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_decoder_layer_matches_torch(variant: tuple[bool, str]) -> None:
    norm_first, activation = variant
    torch.manual_seed(0)
    ours = sf.DecoderLayer(D, H, FF, dropout=0.0, activation=activation, norm_first=norm_first).eval()
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, activation=activation, norm_first=norm_first, batch_first=True
    ).eval()
    randomize_norms(ours)
    pairing = decoder_layer_pairing(ours, ref)
    copy_into_reference(pairing)

    gen = torch.Generator().manual_seed(1)
    T, S = 6, 9
    x = torch.randn(B, T, D, generator=gen, requires_grad=True)
    memory = torch.randn(B, S, D, generator=gen, requires_grad=True)
    tgt_pad, mem_pad = random_padding(B, T, gen), random_padding(B, S, gen)

    out = ours(x, memory, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=mem_pad)  # causal by default
    backward_with(out)
    grads = (x.grad.clone(), memory.grad.clone())
    x.grad = memory.grad = None
    ref_out = ref(
        x,
        memory,
        tgt_mask=~sf.causal_mask(T),
        tgt_key_padding_mask=~tgt_pad,
        memory_key_padding_mask=~mem_pad,
    )
    backward_with(ref_out)

    assert max_diff(out, ref_out) <= TOL
    assert max_diff(grads[0], x.grad) <= TOL
    assert max_diff(grads[1], memory.grad) <= TOL
    assert max_grad_diff(pairing) <= TOL


def test_decoder_layer_explicit_mask_without_causal_matches_torch() -> None:
    """causal=False with a user mask: exactly the user's mask is applied."""
    torch.manual_seed(0)
    ours = sf.DecoderLayer(D, H, FF, dropout=0.0).eval()
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True).eval()
    copy_into_reference(decoder_layer_pairing(ours, ref))
    gen = torch.Generator().manual_seed(3)
    x, memory = torch.randn(B, 5, D, generator=gen), torch.randn(B, 7, D, generator=gen)
    tgt_mask = torch.rand(5, 5, generator=gen) < 0.5
    tgt_mask[:, 0] = True
    mem_mask = torch.rand(5, 7, generator=gen) < 0.5
    mem_mask[:, 0] = True
    out = ours(x, memory, tgt_mask=tgt_mask, memory_mask=mem_mask, causal=False)
    ref_out = ref(x, memory, tgt_mask=~tgt_mask, memory_mask=~mem_mask)
    assert max_diff(out, ref_out) <= TOL


@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layer_norm_matches_torch(eps: float) -> None:
    torch.manual_seed(0)
    ours, ref = sf.LayerNorm(D, eps=eps), nn.LayerNorm(D, eps=eps)
    randomize_norms(ours)
    pairing = [([ours.weight], ref.weight), ([ours.bias], ref.bias)]
    copy_into_reference(pairing)
    x = (3 * torch.randn(B, 5, D) + 2).requires_grad_()
    out = ours(x)
    backward_with(out)
    x_grad = x.grad.clone()
    x.grad = None
    ref_out = ref(x)
    backward_with(ref_out)
    assert max_diff(out, ref_out) <= TOL
    assert max_diff(x_grad, x.grad) <= TOL
    assert max_grad_diff(pairing) <= TOL


def test_layer_norm_keeps_low_precision_dtype() -> None:
    ln = sf.LayerNorm(D)
    x = torch.randn(2, 3, D)
    for dtype in (torch.bfloat16, torch.float16):
        y = ln(x.to(dtype))
        assert y.dtype == dtype
        assert max_diff(y.float(), ln(x)) < 2e-2
