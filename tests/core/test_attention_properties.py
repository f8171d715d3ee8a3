"""Property tests over random shapes and random masks (hypothesis).

- the fused kernel (SDPA) and the explicit kernel agree, forward and backward;
- nothing is ever NaN or inf, not even for query rows with no allowed key (those give zeros);
- fp16 and bf16 stay finite and close to fp32 with masks (no -1e9 overflow, no -inf NaN).
"""

from __future__ import annotations

import torch
from helpers import max_diff
from hypothesis import given, settings
from hypothesis import strategies as st

import scratchformer as sf
from scratchformer.core.masks import expand_attention_mask

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def attention_inputs(draw, dtype=torch.float32):
    B = draw(st.integers(1, 3))
    H = draw(st.integers(1, 4))
    T = draw(st.integers(1, 9))
    S = draw(st.integers(1, 9))
    d_k = draw(st.sampled_from([1, 4, 8]))
    seed = draw(st.integers(0, 2**31 - 1))
    p_allow = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))  # 0.0: every row fully masked
    mask_kind = draw(st.sampled_from(["none", "padding", "2d", "3d", "4d", "padding+2d"]))
    causal = draw(st.booleans()) and S >= T
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d_k, generator=gen).to(dtype)
    k = torch.randn(B, H, S, d_k, generator=gen).to(dtype)
    v = torch.randn(B, H, S, d_k, generator=gen).to(dtype)

    def rand(*shape):
        return torch.rand(shape, generator=gen) < p_allow

    kpm = rand(B, S) if "padding" in mask_kind else None
    attn = {"2d": rand(T, S), "padding+2d": rand(T, S), "3d": rand(B, T, S), "4d": rand(B, H, T, S)}.get(
        mask_kind
    )
    mask = expand_attention_mask(kpm, attn, B, H, T, S)
    return q, k, v, mask, causal


def _full_mask(mask, causal, q, k):
    """The mask actually applied, as a dense (B, H, T, S) bool tensor."""
    B, H, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    full = torch.ones(B, H, T, S, dtype=torch.bool)
    if mask is not None:
        full &= mask
    if causal:
        full &= sf.causal_mask(T, S)
    return full


@SETTINGS
@given(attention_inputs())
def test_fused_kernel_equals_explicit_kernel(inputs) -> None:
    q, k, v, mask, causal = inputs
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fast, none = sf.scaled_dot_product_attention(*leaves, mask, is_causal=causal)
    assert none is None
    fast.sum().backward()
    fast_grads = [t.grad for t in leaves]

    leaves2 = [t.clone().requires_grad_() for t in (q, k, v)]
    slow, weights = sf.scaled_dot_product_attention(*leaves2, mask, is_causal=causal, need_weights=True)
    slow.sum().backward()

    assert max_diff(fast, slow) <= 1e-5
    for a, b in zip(fast_grads, [t.grad for t in leaves2]):
        assert max_diff(a, b) <= 1e-5
    # The weights are probabilities over allowed keys only; rows without any allowed key are 0.
    allowed = _full_mask(mask, causal, q, k)
    assert torch.all(weights[~allowed.expand_as(weights)] == 0)
    row_sum = weights.sum(-1)
    has_key = allowed.any(-1).expand_as(row_sum)
    assert torch.allclose(row_sum[has_key], torch.ones_like(row_sum[has_key]), atol=1e-5)
    assert torch.all(row_sum[~has_key] == 0)


@SETTINGS
@given(attention_inputs())
def test_no_nan_or_inf_forward_and_backward(inputs) -> None:
    q, k, v, mask, causal = inputs
    for need_weights in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = sf.scaled_dot_product_attention(*leaves, mask, is_causal=causal, need_weights=need_weights)
        assert torch.isfinite(out).all()
        out.square().sum().backward()
        for t in leaves:
            assert torch.isfinite(t.grad).all()
        # Fully masked query rows give exactly zero output.
        no_key = ~_full_mask(mask, causal, q, k).any(-1)  # (B, H, T)
        assert torch.all(out[no_key] == 0)


@SETTINGS
@given(attention_inputs(), st.sampled_from([torch.float16, torch.bfloat16]))
def test_low_precision_with_masks_is_finite_and_close(inputs, dtype) -> None:
    q, k, v, mask, causal = inputs
    reference, _ = sf.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
    for need_weights in (False, True):
        out, _ = sf.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), mask, is_causal=causal, need_weights=need_weights
        )
        assert out.dtype == dtype
        assert torch.isfinite(out).all()
        assert max_diff(out.float(), reference) <= 0.05


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([torch.float16, torch.bfloat16]))
def test_multi_head_attention_fully_padded_batch_row(seed, dtype) -> None:
    """A sequence that is all padding: zeros out of attention, finite gradients, in every dtype."""
    torch.manual_seed(seed)
    mha = sf.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16, requires_grad=True)
    kpm = torch.tensor([[True, True, False, False, False], [False] * 5])
    out, w = mha(x, key_padding_mask=kpm, need_weights=True)
    assert torch.isfinite(out).all() and torch.all(w[1] == 0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters())
    low = sf.MultiHeadAttention(16, 4).to(dtype)
    for need_weights in (False, True):
        y, _ = low(x.detach().to(dtype), key_padding_mask=kpm, need_weights=need_weights)
        assert torch.isfinite(y).all()


def test_whole_model_under_bf16_autocast_is_finite() -> None:
    torch.manual_seed(0)
    cfg = sf.TransformerConfig(
        src_vocab_size=30,
        tgt_vocab_size=30,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
    )
    model = sf.Transformer(cfg)
    src = torch.randint(1, 30, (3, 10))
    src[1, 4:] = 0
    src[2, :] = 0  # an entirely padded source sentence
    tgt = torch.randint(1, 30, (3, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_large_scores_stay_finite_in_fp16_in_both_kernels() -> None:
    """q, k ~ N(0, 50^2), d_k = 64: q.k overflows fp16 unless it is scaled before the product."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        (50 * torch.randn(2, 2, 8, 64, generator=gen)).half(),
        (50 * torch.randn(2, 2, 8, 64, generator=gen)).half(),
        torch.randn(2, 2, 8, 64, generator=gen).half(),
    )
    mask = torch.rand(2, 1, 8, 8, generator=gen) < 0.5
    for need_weights in (False, True):
        out, _ = sf.scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
        assert torch.isfinite(out).all(), f"need_weights={need_weights}"


def test_float64_gradcheck() -> None:
    """Analytical gradients equal finite differences (float64) through our hand-written pieces."""
    torch.manual_seed(0)
    ln = sf.LayerNorm(6).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ln, (x,))

    mha = sf.MultiHeadAttention(8, 2).double()
    q = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    kpm = torch.tensor([[True, True, False, False], [False] * 4])  # includes a fully masked row
    for need_weights in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b: mha(a, b, key_padding_mask=kpm, need_weights=need_weights)[0], (q, kv)
        )
