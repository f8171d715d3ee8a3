"""Bad input gets an error that names the argument, the expected and the received."""

from __future__ import annotations

import pytest
import torch

import scratchformer as sf


@pytest.fixture(scope="module")
def model() -> sf.Transformer:
    cfg = sf.TransformerConfig(
        src_vocab_size=20,
        tgt_vocab_size=15,
        d_model=16,
        num_heads=4,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        max_len=12,
    )
    return sf.Transformer(cfg).eval()


def test_d_model_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by num_heads=4"):
        sf.MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by num_heads=4"):
        sf.TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=30, num_heads=4)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="share_embeddings"):
        sf.TransformerConfig(src_vocab_size=5, tgt_vocab_size=6, share_embeddings=True)
    with pytest.raises(ValueError, match="positional"):
        sf.TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, positional="rotary")
    with pytest.raises(ValueError, match="activation"):
        sf.PositionwiseFeedForward(8, 16, activation="swish")
    with pytest.raises(ValueError, match=r"TransformerConfig: unknown key 'd_modle'; did you mean d_model\?"):
        sf.TransformerConfig.from_dict({"src_vocab_size": 5, "tgt_vocab_size": 5, "d_modle": 8})


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2, 16), r"query: expected shape \(B, T, D\) \(3 dims\), got \(2, 16\)"),
        ((2, 3, 8), r"query: expected shape \(B, T, D\) with last dim 16, got \(2, 3, 8\)"),
    ],
)
def test_attention_query_shape(shape, message) -> None:
    with pytest.raises(ValueError, match=message):
        sf.MultiHeadAttention(16, 4)(torch.randn(shape))


def test_attention_key_batch_and_value_length() -> None:
    mha = sf.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"key: expected batch size B=2"):
        mha(torch.randn(2, 3, 16), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match=r"value: expected the key's shape"):
        mha(torch.randn(2, 3, 16), torch.randn(2, 5, 16), torch.randn(2, 4, 16))
    with pytest.raises(TypeError, match=r"query: expected a floating-point tensor"):
        mha(torch.ones(2, 3, 16, dtype=torch.long))


def test_attention_mask_shape_and_dtype() -> None:
    mha = sf.MultiHeadAttention(16, 4)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match=r"key_padding_mask: expected shape \(B, S\)=\(2, 3\), got \(2, 4\)"):
        mha(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask: expected shape \(T, S\)=\(3, 3\) or .*got \(4, 4\)"):
        mha(x, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"attn_mask: expected dtype torch.bool .* got torch.float32"):
        mha(x, attn_mask=torch.zeros(3, 3))


def test_token_ids_out_of_range(model) -> None:
    ok = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"src: token id 20 is outside the vocabulary range \[0, 20\)"):
        model(torch.full((2, 4), 20), ok)
    with pytest.raises(ValueError, match=r"tgt: token id -1 is outside the vocabulary range \[0, 15\)"):
        model(ok, torch.full((2, 4), -1))
    with pytest.raises(TypeError, match=r"src: expected integer token ids"):
        model(torch.ones(2, 4), ok)
    with pytest.raises(ValueError, match=r"src: expected shape \(B, L\) of token ids, got \(4,\)"):
        model(torch.ones(4, dtype=torch.long), ok)


def test_sequence_longer_than_max_len(model) -> None:
    ok = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(
        ValueError, match=r"src: sequence length 13 exceeds the configured maximum max_len=12"
    ):
        model(torch.ones(2, 13, dtype=torch.long), ok)
    with pytest.raises(ValueError, match=r"tgt: sequence length 13 exceeds .* max_len=12"):
        model(ok, torch.ones(2, 13, dtype=torch.long))


def test_padding_mask_and_memory_mismatch(model) -> None:
    src, tgt = torch.ones(2, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"src_padding_mask: expected shape \(B, L\)=\(2, 4\), got \(2, 5\)"):
        model(src, tgt, src_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"tgt_padding_mask: expected dtype torch.bool"):
        model(src, tgt, tgt_padding_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"memory: expected shape \(B, S, D\) with last dim 16"):
        model.decode(tgt, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"memory: expected batch size B=2"):
        model.decode(tgt, torch.randn(3, 4, 16))
    with pytest.raises(ValueError, match=r"memory: expected the encoder output"):
        model.decoder(torch.randn(2, 3, 16), None)


def test_building_blocks_name_the_wrong_width() -> None:
    with pytest.raises(
        ValueError, match=r"x: expected shape \(\.\.\., D\) with last dim 16, got \(2, 3, 8\)"
    ):
        sf.LayerNorm(16)(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, L, D\) with last dim 16, got \(2, 3, 8\)"):
        sf.PositionwiseFeedForward(16, 32)(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, L, D\) with last dim 16"):
        sf.SinusoidalPositionalEncoding(16)(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, L, D\) \(3 dims\)"):
        sf.LearnedPositionalEmbedding(8, 16)(torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"tokens: token id 10 is outside the vocabulary range \[0, 10\)"):
        sf.TokenEmbedding(10, 16)(torch.tensor([[1, 10]]))


def test_kernel_and_mask_helpers_name_the_problem() -> None:
    q = torch.randn(2, 4, 3, 8)
    with pytest.raises(TypeError, match=r"mask: expected dtype torch.bool"):
        sf.scaled_dot_product_attention(q, q, q, torch.zeros(2, 4, 3, 3))
    with pytest.raises(ValueError, match=r"mask: expected shape \(B, H, T, S\)=\(2, 4, 3, 3\), got \(3,\)"):
        sf.scaled_dot_product_attention(q, q, q, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"q, k, v: expected \(B, H, T, d_k\), .* got \(4, 3, 8\), "):
        sf.scaled_dot_product_attention(q[0], q, q)
    with pytest.raises(ValueError, match=r"combine_masks: mask 1 of shape \(4, 4\) does not broadcast"):
        sf.combine_masks(torch.ones(3, 3, dtype=torch.bool), torch.ones(4, 4, dtype=torch.bool))


def test_config_rejects_negative_layers_and_eps() -> None:
    with pytest.raises(ValueError, match=r"num_encoder_layers must be >= 0 \(an integer\), got -1"):
        sf.TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, num_encoder_layers=-1)
    with pytest.raises(ValueError, match=r"num_decoder_layers must be positive \(an integer\), got 0"):
        sf.TransformerConfig(
            src_vocab_size=5, tgt_vocab_size=5, num_decoder_layers=0
        )  # its cache would count no step
    with pytest.raises(ValueError, match="layer_norm_eps must be positive"):
        sf.TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, layer_norm_eps=-1.0)


def test_decoding_arguments(model) -> None:
    src = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="eos_id=0 equals the model's pad_id"):
        sf.greedy_decode(model, src, bos_id=1, eos_id=0)
    with pytest.raises(ValueError, match=r"bos_id=15 is outside the target vocabulary \[0, 15\)"):
        sf.greedy_decode(model, src, bos_id=15, eos_id=2)
    model.train()
    try:
        with pytest.warns(UserWarning, match="training mode"):
            sf.greedy_decode(model, src, bos_id=1, eos_id=2, max_len_b=1)
    finally:
        model.eval()


def test_cache_misuse_is_an_error() -> None:
    mha = sf.MultiHeadAttention(16, 4)
    memory = torch.randn(3, 5, 16)
    cache = sf.KVCache()
    mha(torch.randn(3, 1, 16), memory, cache=cache, static_kv=True)
    with pytest.raises(
        ValueError, match="memory: the cache holds keys/values of a memory of length 5, got length 7"
    ):
        mha(torch.randn(3, 1, 16), torch.randn(3, 7, 16), cache=cache, static_kv=True)
    cache.reorder(torch.tensor([0, 1]))  # now batch 2
    with pytest.raises(
        ValueError, match="cache: holds keys for batch size 2, but the input has batch size 3"
    ):
        mha(torch.randn(3, 1, 16), cache=cache, static_kv=True)
    with pytest.raises(ValueError, match="cross-attention .* needs the memory"):
        mha(torch.randn(3, 1, 16), cache=sf.KVCache(), static_kv=True)


def test_stacks_check_their_input_before_the_masks() -> None:
    torch.manual_seed(0)
    cfg = sf.TransformerConfig(
        20, 20, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
    )
    model = sf.Transformer(cfg).eval()
    with pytest.raises(TypeError, match=r"x: expected a torch.Tensor \(B, S, D\), got list"):
        model.encoder([[1.0]])
    with pytest.raises(ValueError, match=r"x: expected shape \(B, T, D\) \(3 dims\), got \(5, 16\)"):
        model.decoder(
            torch.randn(5, 16),
            torch.randn(5, 3, 16),
            tgt_key_padding_mask=torch.ones(5, 16, dtype=torch.bool),
        )
    memory = model.encode(torch.tensor([[5, 6, 7]]))
    with pytest.raises(ValueError, match=r"src_padding_mask: expected shape \(B, S\)=\(1, 3\), got \(1, 4\)"):
        model.decode(torch.tensor([[1]]), memory, src_padding_mask=torch.ones(1, 4, dtype=torch.bool))
    skipping = sf.optimize(sf.Encoder([sf.EncoderLayer(16, 2, 32)]), skip_padding=True)
    with pytest.raises(TypeError, match=r"x: expected a floating-point tensor"):
        skipping(torch.ones(2, 3, 16, dtype=torch.long), torch.tensor([[True, True, False]] * 2))
