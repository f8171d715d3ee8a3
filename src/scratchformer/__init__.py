"""scratchformer: the Transformer of "Attention Is All You Need", from scratch in PyTorch.

Mask convention everywhere: bool tensors, True = may attend (see :mod:`scratchformer.masks`).
Shape letters: B batch, S source length, T target length, D model width, H heads, V vocabulary.
"""

from scratchformer.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from scratchformer.decoder import Decoder, DecoderCache, DecoderLayer, DecoderLayerCache
from scratchformer.decoding import greedy_decode
from scratchformer.embedding import TokenEmbedding
from scratchformer.encoder import Encoder, EncoderLayer
from scratchformer.feedforward import PositionwiseFeedForward
from scratchformer.layer_norm import LayerNorm
from scratchformer.masks import causal_mask, combine_masks, padding_mask
from scratchformer.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from scratchformer.transformer import Transformer, TransformerConfig

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "DecoderLayerCache",
    "Encoder",
    "EncoderLayer",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "combine_masks",
    "greedy_decode",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]
