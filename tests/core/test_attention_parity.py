"""MultiHeadAttention == torch.nn.MultiheadAttention(batch_first=True), outputs, weights and gradients.

PyTorch's boolean masks mean the opposite of ours (True = blocked), so the reference receives
``~mask``: the polarity itself is under test.
"""

from __future__ import annotations

import pytest
import torch
from helpers import (
    TOL,
    backward_with,
    copy_into_reference,
    max_diff,
    max_grad_diff,
    mha_pairing,
    random_padding,
)
from torch import nn

import scratchformer as sf

D, H, B = 32, 4, 3


def make_pair(seed: int = 0) -> tuple[sf.MultiHeadAttention, nn.MultiheadAttention, list]:
    torch.manual_seed(seed)
    ours = sf.MultiHeadAttention(D, H).eval()
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    pairing = mha_pairing(ours, ref)
    copy_into_reference(pairing)
    return ours, ref, pairing


def random_attn_mask(T: int, S: int, gen: torch.Generator, batch: int | None = None) -> torch.Tensor:
    """Random bool mask, True = may attend, with at least one allowed key per query row."""
    shape = (T, S) if batch is None else (batch, T, S)
    mask = torch.rand(shape, generator=gen) < 0.6
    mask[..., 0] = True
    return mask


CASES = [
    "self",
    "cross",
    "self+padding",
    "cross+padding",
    "self+attn_mask",
    "cross+both",
    "self+causal+padding",
]


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_multihead_attention(case: str) -> None:
    ours, ref, pairing = make_pair()
    gen = torch.Generator().manual_seed(1)
    T = 6
    S = 9 if "cross" in case else T
    query = torch.randn(B, T, D, generator=gen, requires_grad=True)
    key = torch.randn(B, S, D, generator=gen, requires_grad=True) if "cross" in case else query
    value = torch.randn(B, S, D, generator=gen, requires_grad=True) if "cross" in case else query

    kpm = random_padding(B, S, gen) if ("padding" in case or "both" in case) else None
    attn = None
    if "attn_mask" in case or "both" in case:
        attn = random_attn_mask(T, S, gen)
    if "causal" in case:
        attn = sf.causal_mask(T)

    out, weights = ours(query, key, value, key_padding_mask=kpm, attn_mask=attn, need_weights=True)
    ref_out, ref_weights = ref(
        query,
        key,
        value,
        key_padding_mask=None if kpm is None else ~kpm,
        attn_mask=None if attn is None else ~attn,
        need_weights=True,
        average_attn_weights=False,
    )
    assert out.shape == (B, T, D) and weights.shape == (B, H, T, S)
    assert max_diff(out, ref_out) <= TOL
    assert max_diff(weights, ref_weights) <= TOL

    # The fast kernel (SDPA, no weights) gives the same output.
    fast_out, no_weights = ours(query, key, value, key_padding_mask=kpm, attn_mask=attn)
    assert no_weights is None
    assert max_diff(fast_out, ref_out) <= TOL

    # Gradients w.r.t. inputs and every parameter.
    backward_with(fast_out)
    ours_input_grads = [t.grad.clone() for t in {id(t): t for t in (query, key, value)}.values()]
    for t in (query, key, value):
        t.grad = None
    backward_with(ref_out)
    ref_input_grads = [t.grad for t in {id(t): t for t in (query, key, value)}.values()]
    for g_ours, g_ref in zip(ours_input_grads, ref_input_grads):
        assert max_diff(g_ours, g_ref) <= TOL
    assert max_grad_diff(pairing) <= TOL


def test_per_batch_and_per_head_masks_match_torch() -> None:
    """(B, T, S) and (B, H, T, S) masks: PyTorch takes them as (B*H, T, S)."""
    ours, ref, _ = make_pair()
    gen = torch.Generator().manual_seed(2)
    T, S = 5, 7
    query, key = torch.randn(B, T, D, generator=gen), torch.randn(B, S, D, generator=gen)
    per_head = torch.rand(B, H, T, S, generator=gen) < 0.5
    per_head[..., 0] = True
    per_batch = random_attn_mask(T, S, gen, batch=B)
    for mask, torch_mask in [
        (per_head, ~per_head.reshape(B * H, T, S)),
        (per_batch, ~per_batch.repeat_interleave(H, dim=0)),
    ]:
        out, w = ours(query, key, key, attn_mask=mask, need_weights=True)
        ref_out, ref_w = ref(query, key, key, attn_mask=torch_mask, average_attn_weights=False)
        assert max_diff(out, ref_out) <= TOL
        assert max_diff(w, ref_w) <= TOL


def test_no_bias_matches_torch() -> None:
    torch.manual_seed(0)
    ours = sf.MultiHeadAttention(D, H, bias=False).eval()
    ref = nn.MultiheadAttention(D, H, batch_first=True, bias=False).eval()
    copy_into_reference(
        [
            ([ours.qkv_proj.weight], ref.in_proj_weight),
            ([ours.out_proj.weight], ref.out_proj.weight),
        ]
    )
    x = torch.randn(B, 4, D)
    assert max_diff(ours(x)[0], ref(x, x, x)[0]) <= TOL


def test_incremental_self_attention_with_cache_equals_full_causal() -> None:
    ours, _, _ = make_pair()
    x = torch.randn(B, 7, D)
    full, _ = ours(x, is_causal=True)
    cache = sf.KVCache()
    steps = [ours(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(7)]
    assert len(cache) == 7
    assert max_diff(torch.cat(steps, dim=1), full) <= TOL


def test_cross_attention_cache_computes_memory_once() -> None:
    ours, _, _ = make_pair()
    q, memory = torch.randn(B, 1, D), torch.randn(B, 9, D)
    cache = sf.KVCache()
    first, _ = ours(q, memory, cache=cache, static_kv=True)
    k_first = cache.k
    second, _ = ours(q, None, cache=cache, static_kv=True)  # memory not needed again
    assert cache.k is k_first
    assert max_diff(first, second) == 0.0
