"""The speed paths (scratchformer.fast, switched on by ``optimize``) give the values of core/:
skip_padding (packed real tokens, attention per sequence) as the plain path and as torch.nn's
nested-tensor fast path (which also skips padding); FastLayerNorm (ATen's kernel) and
FastFeedForward's in-place ReLU as the core modules, forward and backward, in fp32 and bf16;
FastEncoderLayer alone and in its stack, under every mask and under bf16 autocast; a whole
optimized Transformer as the core one; the KV cache's growable buffer (generation/) as torch.cat."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import TOL, backward_with, copy_into_reference, encoder_layer_pairing, max_diff, randomize_norms
from torch import nn

import scratchformer as sf
from scratchformer.fast import (
    FastEncoder,
    FastEncoderLayer,
    FastFeedForward,
    FastLayerNorm,
    Packing,
    optimize,
)
from scratchformer.fast.attention import packed_self_attention

D, H, FF, N = 32, 4, 64, 2


def _encoder(norm_first: bool, activation: str = "relu") -> sf.Encoder:
    torch.manual_seed(0)
    layers = [
        sf.EncoderLayer(D, H, FF, dropout=0.0, activation=activation, norm_first=norm_first) for _ in range(N)
    ]
    encoder = sf.Encoder(layers, sf.LayerNorm(D) if norm_first else None).eval()
    randomize_norms(encoder)
    return encoder


def _skipping(encoder: sf.Encoder) -> sf.Encoder:
    """An optimized copy that skips padding (same weights)."""
    fast = optimize(copy.deepcopy(encoder), skip_padding=True)
    assert isinstance(fast, FastEncoder) and fast.skip_padding
    return fast


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, D, generator=gen)
    lengths = torch.tensor([9, 5, 1, 7])
    return x, torch.arange(9)[None, :] < lengths[:, None]


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
def test_skip_padding_equals_torch_fast_path(norm_first: bool) -> None:
    """torch.nn.TransformerEncoder's fast path (nested tensors) is an independent implementation
    of the same idea: real positions computed, zeros at padding."""
    ours = _encoder(norm_first)
    ref = nn.TransformerEncoder(  # fast path: eval, inference mode, post-LN
        nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first, batch_first=True),
        N,
        norm=nn.LayerNorm(D) if norm_first else None,
        enable_nested_tensor=True,
    ).eval()
    for a, b in zip(ours.layers, ref.layers):
        copy_into_reference(encoder_layer_pairing(a, b))
    if norm_first:
        assert ours.norm is not None and ref.norm is not None
        copy_into_reference([([ours.norm.weight], ref.norm.weight), ([ours.norm.bias], ref.norm.bias)])
    x, mask = _batch()
    with torch.inference_mode():
        packed = _skipping(ours)(x, mask)
        plain = ours(x, mask)
        expected = ref(x, src_key_padding_mask=~mask)
    assert packed.shape == x.shape
    assert max_diff(packed[mask], expected[mask]) <= TOL
    if not norm_first:  # torch.nn skips padding only for post-LN; it then returns zeros there too
        assert max_diff(packed, expected) <= TOL
    assert torch.all(packed[~mask] == 0)
    assert max_diff(packed[mask], plain[mask]) <= TOL
    assert plain[~mask].abs().max() > 0.1  # the plain path does compute the padded positions


def test_skip_padding_gradients_hidden_states_and_attn_mask() -> None:
    plain = _encoder(norm_first=False, activation="gelu").train()  # dropout 0: deterministic
    x, mask = _batch()
    attn_mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(2)) > 0.3
    results = []
    for ours in (plain, _skipping(plain)):
        xi = x.clone().requires_grad_(True)
        out, hidden = ours(xi, mask, attn_mask=attn_mask, output_hidden_states=True)
        backward_with(out * mask[..., None])  # a loss on the real positions only
        results.append((out, hidden, xi.grad, [p.grad.clone() for p in ours.parameters()]))
    (out0, hid0, gx0, gp0), (out1, hid1, gx1, gp1) = results
    assert max_diff(out0[mask], out1[mask]) <= TOL
    assert len(hid0) == len(hid1) == N + 1
    assert all(max_diff(a[mask], b[mask]) <= TOL for a, b in zip(hid0, hid1))
    assert max_diff(gx0, gx1) <= TOL
    assert max(max_diff(a, b) for a, b in zip(gp0, gp1)) <= TOL


def test_skip_padding_fully_padded_row_and_contextual_encoder() -> None:
    cfg = sf.EncoderConfig(vocab_size=50, d_model=D, num_heads=H, num_layers=N, d_ff=FF, dropout=0.0)
    model = sf.ContextualEncoder(cfg).eval()
    tokens = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [0, 0, 0, 0]])
    with torch.no_grad():
        plain, packed = model(tokens), optimize(copy.deepcopy(model), skip_padding=True)(tokens)
    real = tokens != 0
    assert torch.isfinite(packed).all() and torch.all(packed[~real] == 0)
    assert max_diff(plain[real], packed[real]) <= TOL


def test_packing_round_trip_and_errors() -> None:
    mask = torch.tensor([[True, True, False], [True, False, False]])
    packing = Packing.from_mask(mask)
    x = torch.arange(6.0).view(2, 3, 1)
    assert len(packing) == 3
    assert packing.pack(x).flatten().tolist() == [0.0, 1.0, 3.0]
    assert packing.unpack(packing.pack(x)).flatten().tolist() == [0.0, 1.0, 0.0, 3.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="expected shape"):
        packing.pack(torch.zeros(2, 4, 1))
    with pytest.raises(ValueError, match="packed tokens"):
        packing.unpack(torch.zeros(4, 1))
    with pytest.raises(TypeError, match="torch.bool"):
        Packing.from_mask(mask.long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_layer_norm_and_feed_forward_equal_core_forward_and_backward(dtype: torch.dtype) -> None:
    """ATen's LayerNorm against autograd through the core formula, and the in-place ReLU against
    the plain one: same outputs, same gradients for input and parameters."""
    torch.manual_seed(0)
    tol = TOL if dtype == torch.float32 else 2e-2
    for core in (sf.LayerNorm(D), sf.PositionwiseFeedForward(D, FF, dropout=0.0)):
        randomize_norms(core)
        fast = optimize(copy.deepcopy(core))
        assert type(fast) in (FastLayerNorm, FastFeedForward)
        x = torch.randn(3, 5, D)
        results = []
        for module in (core, fast):
            xi = x.clone().to(dtype).requires_grad_(True)
            out = module.to(dtype)(xi)
            backward_with(out.float())
            results.append((out.float(), xi.grad.float(), [p.grad.float() for p in module.parameters()]))
        (out0, gx0, gp0), (out1, gx1, gp1) = results
        assert out1.dtype == torch.float32 and max_diff(out0, out1) <= tol
        assert max_diff(gx0, gx1) <= tol and max(max_diff(a, b) for a, b in zip(gp0, gp1)) <= tol * 10


def test_optimized_transformer_equals_core_and_keeps_its_parameters() -> None:
    cfg = sf.TransformerConfig(
        30,
        30,
        d_model=D,
        num_heads=H,
        d_ff=FF,
        num_encoder_layers=N,
        num_decoder_layers=N,
        dropout=0.0,
        norm_first=True,
    )
    torch.manual_seed(0)
    core = sf.Transformer(cfg)
    fast = copy.deepcopy(core)
    params = {name: p for name, p in fast.named_parameters()}
    assert optimize(fast) is fast
    assert {name: p for name, p in fast.named_parameters()} == params  # same tensors, not copies
    assert fast.state_dict().keys() == core.state_dict().keys()
    assert isinstance(fast.encoder, FastEncoder) and isinstance(fast.decoder.norm, FastLayerNorm)
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    tgt = torch.tensor([[1, 12, 13], [1, 14, 0]])
    outs = []
    for model in (core, fast):
        out = model(src, tgt)
        backward_with(out)
        outs.append((out, [p.grad for p in model.parameters()]))
    assert max_diff(outs[0][0], outs[1][0]) <= TOL
    assert max(max_diff(a, b) for a, b in zip(outs[0][1], outs[1][1])) <= TOL


def test_kv_cache_buffer_equals_concatenation_and_survives_reorder() -> None:
    gen = torch.Generator().manual_seed(3)
    order = torch.tensor([2, 0])  # beam search keeps rows 2 and 0 after step 30

    def kv(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, 2, 1, 4, generator=gen), torch.randn(batch, 2, 1, 4, generator=gen)

    steps = [kv(3) for _ in range(31)] + [kv(2) for _ in range(9)]
    cache = sf.KVCache()
    with torch.no_grad():
        for i, (k, v) in enumerate(steps):
            if i == 20:
                early_k = cache.k
                assert early_k is not None
                early = early_k.clone()
            if i == 31:
                cache.reorder(order)
            k_all, v_all = cache.append(k, v)
    expected_k = torch.cat([k[order] if i < 31 else k for i, (k, _) in enumerate(steps)], dim=2)
    expected_v = torch.cat([v[order] if i < 31 else v for i, (_, v) in enumerate(steps)], dim=2)
    assert len(cache) == 40 and torch.equal(k_all, expected_k) and torch.equal(v_all, expected_v)
    assert torch.equal(early_k, early)  # a view handed out earlier is never overwritten
    assert cache._buffers is not None and cache._buffers[0].shape[2] >= 40  # the buffer path did run


def test_all_real_padding_mask_runs_unmasked_and_bad_masks_still_fail() -> None:
    ours = _encoder(norm_first=False)
    x, _ = _batch()
    full = torch.ones(4, 9, dtype=torch.bool)
    fast = optimize(copy.deepcopy(ours))
    with torch.no_grad():
        assert max_diff(fast(x, full), ours(x)) <= TOL
        assert max_diff(_skipping(ours)(x, full), ours(x)) <= TOL
    with pytest.raises(ValueError, match="key_padding_mask"):
        fast(x, torch.ones(4, 10, dtype=torch.bool))


def test_fast_layer_norm_mixed_precision_keeps_fp32_affine_and_input_dtype() -> None:
    """bf16 input with fp32 gamma/beta (a model in fp32 fed bf16): statistics and affine in fp32,
    one rounding to bf16 at the end, as the core module; bf16 in, bf16 out; fp32 in, fp32 out."""
    torch.manual_seed(0)
    core = sf.LayerNorm(D, eps=1e-12)
    randomize_norms(core)
    fast = optimize(copy.deepcopy(core))
    x = (torch.randn(4, 7, D) * 30 + 5).bfloat16()
    with torch.no_grad():
        out_core, out_fast = core(x), fast(x)
        exact = core(x.double())  # fp64 reference of the same formula
    assert out_fast.dtype == torch.bfloat16 == out_core.dtype
    bound = 2**-8 * exact.abs().max().item()  # one rounding to bf16 (8 significant bits)
    assert (
        max_diff(out_fast.double(), exact) <= bound
        and max_diff(out_fast.float(), out_core.float()) <= 2 * bound
    )
    assert fast(x.float()).dtype == torch.float32
    with pytest.raises(ValueError, match="last dim 32"):
        fast(torch.zeros(2, 5))


def _masks() -> tuple[torch.Tensor, torch.Tensor]:
    """A key-padding mask with holes (not only trailing padding) and a fully padded row, and an
    attention mask."""
    kpm = torch.tensor(
        [[1, 1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0, 0], [1] * 9, [0, 1, 1, 1, 0, 0, 0, 0, 0]],
        dtype=torch.bool,
    )
    return kpm, torch.rand(9, 9, generator=torch.Generator().manual_seed(4)) > 0.3


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
def test_fast_encoder_layer_alone_equals_core_layer_with_every_mask(norm_first: bool) -> None:
    torch.manual_seed(0)
    core = sf.EncoderLayer(D, H, FF, dropout=0.0, norm_first=norm_first, activation="gelu")
    randomize_norms(core)
    fast = optimize(copy.deepcopy(core))
    assert isinstance(fast, FastEncoderLayer)
    x, _ = _batch()
    kpm, attn = _masks()
    for masks in (
        {},
        {"key_padding_mask": kpm},
        {"attn_mask": attn},
        {"key_padding_mask": kpm, "attn_mask": attn},
    ):
        results = []
        for layer in (core, fast):
            xi = x.clone().requires_grad_(True)
            out = layer(xi, **masks)
            backward_with(out)
            results.append((out, xi.grad, [p.grad.clone() for p in layer.parameters()]))
            layer.zero_grad()
        (o0, gx0, gp0), (o1, gx1, gp1) = results
        assert max_diff(o0, o1) <= TOL and max_diff(gx0, gx1) <= TOL, masks
        assert max(max_diff(a, b) for a, b in zip(gp0, gp1)) <= TOL, masks
    with pytest.raises(ValueError, match="key_padding_mask"):
        fast(x, key_padding_mask=kpm[:, :5])


def test_per_sequence_attention_equals_masked_attention_with_holes() -> None:
    """Packed attention, one sequence at a time, against the core module on the padded batch under
    the key-padding mask (real queries compared; a fully padded row has no packed tokens)."""
    torch.manual_seed(0)
    attn = sf.MultiHeadAttention(D, H)
    x, _ = _batch()
    kpm, _ = _masks()
    packing = Packing.from_mask(kpm)
    assert packing.lengths == [7, 0, 9, 3]
    with torch.no_grad():
        expected, _ = attn(x, key_padding_mask=kpm)
        got = packing.unpack(packed_self_attention(attn, packing.pack(x), packing.lengths))
    assert max_diff(got[kpm], expected[kpm]) <= TOL
    # mutation check: attending across sequences (one sequence of all N tokens) is not the same
    with torch.no_grad():
        wrong = packing.unpack(packed_self_attention(attn, packing.pack(x), [len(packing)]))
    assert max_diff(wrong[kpm], expected[kpm]) > 0.01


@pytest.mark.parametrize("skip_padding", [False, True], ids=["padded", "skip_padding"])
def test_optimized_encoder_under_bf16_autocast_equals_core_forward_and_backward(skip_padding: bool) -> None:
    """Under autocast the sub-layers return bf16 and the residual stream stays fp32: the in-place
    residual must then add out of place (a bf16 result would lose the stream's precision)."""
    core = _encoder(norm_first=True).train()  # dropout 0: deterministic
    fast = optimize(copy.deepcopy(core), skip_padding=skip_padding)
    x, mask = _batch()
    results = []
    for model in (core, fast):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(xi, mask)
        assert out.dtype == torch.float32
        backward_with(out * mask[..., None])
        results.append((out, xi.grad, [p.grad.clone() for p in model.parameters()]))
    (o0, gx0, gp0), (o1, gx1, gp1) = results
    assert max_diff(o0[mask], o1[mask]) <= 2e-2 and max_diff(gx0, gx1) <= 2e-2
    assert max(max_diff(a, b) / (a.abs().max().item() + 1e-6) for a, b in zip(gp0, gp1)) <= 5e-2
    with torch.no_grad():  # and bf16 end to end (the model cast), against the fp32 core
        got = optimize(copy.deepcopy(core), skip_padding=skip_padding).bfloat16()(x.bfloat16(), mask).float()
        assert max_diff(got[mask], core(x, mask)[mask]) <= 0.1


def test_single_bf16_query_attends_in_fp32_as_the_core_formula() -> None:
    """A decoding step (one query) in bf16: the fast module computes the core's explicit formula in
    fp32; against fp64 and the core module, with padding and weights on request; and a whole
    KV-cached greedy search in bf16 gives the fp32 core model's tokens."""
    from scratchformer.fast import FastMultiHeadAttention

    torch.manual_seed(0)
    core = sf.MultiHeadAttention(D, H).bfloat16().eval()
    fast = optimize(copy.deepcopy(core))
    assert isinstance(fast, FastMultiHeadAttention)
    q, mem = torch.randn(3, 1, D).bfloat16(), torch.randn(3, 11, D).bfloat16()
    kpm = torch.arange(11)[None, :] < torch.tensor([11, 4, 7])[:, None]
    with torch.no_grad():
        exact, exact_w = copy.deepcopy(core).double()(
            q.double(), mem.double(), key_padding_mask=kpm, need_weights=True
        )
        out_core, _ = core(q, mem, key_padding_mask=kpm)
        out_fast, w_fast = fast(q, mem, key_padding_mask=kpm, need_weights=True)
        out_plain, none = fast(q, mem, key_padding_mask=kpm)
    assert out_fast.dtype == torch.bfloat16 and none is None and torch.equal(out_plain, out_fast)
    assert max_diff(out_fast.double(), exact) <= 1e-2 and max_diff(out_fast.float(), out_core.float()) <= 1e-2
    assert max_diff(w_fast.double(), exact_w) <= 1e-2
    assert torch.all(w_fast[1, :, :, 4:] == 0)  # padded keys get no weight

    cfg = sf.TransformerConfig(
        30, 30, d_model=D, num_heads=H, d_ff=FF, num_encoder_layers=N, num_decoder_layers=N, dropout=0.0
    )
    model = sf.Transformer(cfg).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    with torch.no_grad():
        expected = sf.greedy_decode(model, src, bos_id=1, eos_id=2, max_len_b=8)
        got = sf.greedy_decode(
            optimize(copy.deepcopy(model)).bfloat16(), src, bos_id=1, eos_id=2, max_len_b=8
        )
    assert torch.equal(got, expected)


def test_hooks_on_a_layer_or_its_modules_fire_and_see_their_own_outputs() -> None:
    """A hook on a layer, or one keeping a sub-module's output (activation capture), makes the stack
    run the readable path: the hook fires, and what it kept is not overwritten by an in-place
    residual."""
    core = _encoder(norm_first=False)
    fast = optimize(copy.deepcopy(core))
    x, mask = _batch()
    kept: dict[str, list[torch.Tensor]] = {"core": [], "fast": []}
    calls = []
    for name, model in (("core", core), ("fast", fast)):
        model.layers[0].feed_forward.register_forward_hook(
            lambda m, i, out, name=name: kept[name].append(out)
        )
    fast.layers[1].register_forward_pre_hook(lambda m, i: calls.append(1))
    with torch.no_grad():
        assert max_diff(core(x, mask), fast(x, mask)) <= TOL
    assert calls == [1] and len(kept["fast"]) == 1
    assert max_diff(kept["core"][0], kept["fast"][0]) <= TOL
