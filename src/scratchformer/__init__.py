"""scratchformer: the Transformer of "Attention Is All You Need", from scratch in PyTorch.

Mask convention everywhere: bool tensors, True = may attend (see :mod:`scratchformer.masks`).
Shape letters: B batch, S source length, T target length, D model width, H heads, V vocabulary.
"""

from scratchformer.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from scratchformer.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.decoder import Decoder, DecoderCache, DecoderLayer, DecoderLayerCache
from scratchformer.decoding import beam_search, greedy_decode
from scratchformer.embedding import TokenEmbedding
from scratchformer.encoder import Encoder, EncoderLayer
from scratchformer.encoder_model import ContextualEncoder, EncoderConfig, EncoderEmbedding
from scratchformer.feedforward import PositionwiseFeedForward
from scratchformer.layer_norm import LayerNorm
from scratchformer.masks import causal_mask, combine_masks, padding_mask
from scratchformer.patch_embedding import PatchEmbedding
from scratchformer.pooling import masked_mean, pool
from scratchformer.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from scratchformer.pretrained import CheckpointError, SentenceEncoder, load_bert_encoder
from scratchformer.tokenization import TextTokenizer, TokenBatch
from scratchformer.transformer import Transformer, TransformerConfig

__version__ = "0.1.0"

__all__ = [
    "CaptioningConfig",
    "CaptioningTransformer",
    "CheckpointError",
    "ContextualEncoder",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "DecoderLayerCache",
    "Encoder",
    "EncoderConfig",
    "EncoderEmbedding",
    "EncoderLayer",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PatchEmbedding",
    "PositionwiseFeedForward",
    "SentenceEncoder",
    "SinusoidalPositionalEncoding",
    "TextTokenizer",
    "TokenBatch",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "causal_mask",
    "combine_masks",
    "greedy_decode",
    "load_bert_encoder",
    "masked_mean",
    "padding_mask",
    "pool",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]
