"""Attention maps come from outside the model (forward hooks), with the weights the model computes."""

from __future__ import annotations

import torch

import scratchformer as sf
from scratchformer.viz.attention_maps import record_attention


def test_record_attention_keeps_each_modules_weights_and_leaves_no_trace() -> None:
    torch.manual_seed(0)
    cfg = sf.TransformerConfig(
        20, 20, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=1, dropout=0.0
    )
    model = sf.Transformer(cfg).eval()
    src, tgt = torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 8, 9]])
    with torch.no_grad():
        plain = model(src, tgt)
        with record_attention(model) as recorded:
            recorded_out = model(src, tgt)
            asked = model.encoder.layers[0].self_attn(torch.randn(1, 4, 16), need_weights=True)[1]
        memory = model.encode(src)
        cross = model.decoder.layers[0].cross_attn(
            torch.randn(1, 3, 16), memory, key_padding_mask=src != 0, need_weights=True
        )[1]
    assert torch.allclose(plain, recorded_out, atol=1e-6)  # the explicit kernel, same values as the fused one
    assert sorted(recorded) == [
        "decoder.layers.0.cross_attn",
        "decoder.layers.0.self_attn",
        "encoder.layers.0.self_attn",
        "encoder.layers.1.self_attn",
    ]
    enc = recorded["encoder.layers.0.self_attn"][0]
    assert enc.shape == (1, 2, 4, 4) and torch.allclose(enc.sum(-1), torch.ones(1, 2, 4))
    assert torch.all(enc[..., 3] == 0)  # the padded key gets no attention
    dec_self = recorded["decoder.layers.0.self_attn"][0]
    assert torch.all(dec_self.triu(1) == 0)  # causal
    assert recorded["decoder.layers.0.cross_attn"][0].shape == cross.shape == (1, 2, 3, 4)
    assert (
        asked is not None and len(recorded["encoder.layers.0.self_attn"]) == 2
    )  # a caller who asks still gets them
    for module in model.modules():  # the hooks are gone, and nothing was set inside the modules
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert not hasattr(module, "record_weights")


def test_unasked_callers_get_none_while_recording() -> None:
    mha = sf.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 3, 8)
    with record_attention(torch.nn.ModuleList([mha])) as recorded:
        out, weights = mha(x)
    assert weights is None and len(recorded["0"]) == 1
    assert torch.allclose(out, mha(x)[0])


def test_recording_works_on_an_encoder_that_skips_padding() -> None:
    """The packed path never calls the attention modules; with hooks on them it runs the readable path."""
    encoder = sf.optimize(
        sf.ContextualEncoder(sf.EncoderConfig(30, d_model=16, num_heads=2, d_ff=32, num_layers=2)),
        skip_padding=True,
    ).eval()
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    with torch.no_grad(), record_attention(encoder) as recorded:
        encoder(tokens)
    assert [len(calls) for calls in recorded.values()] == [1, 1]
    assert torch.all(recorded["encoder.layers.0.self_attn"][0][1, :, :, 1:] == 0)  # padding gets no attention
