"""scratchformer: the Transformer of "Attention Is All You Need", from scratch in PyTorch.

Mask convention everywhere: bool tensors, True = may attend (see :mod:`scratchformer.core.masks`).
Shape letters: B batch, S source length, T target length, D model width, H heads, V vocabulary.
"""

from scratchformer.core.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from scratchformer.models.captioning import CaptioningConfig, CaptioningTransformer
from scratchformer.core.decoder import Decoder, DecoderCache, DecoderLayer, DecoderLayerCache
from scratchformer.generation.decoding import beam_search, greedy_decode
from scratchformer.core.embedding import TokenEmbedding
from scratchformer.core.encoder import Encoder, EncoderLayer
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig, EncoderEmbedding
from scratchformer.core.feedforward import PositionwiseFeedForward
from scratchformer.core.layer_norm import LayerNorm
from scratchformer.core.masks import causal_mask, combine_masks, padding_mask
from scratchformer.models.patch_embedding import PatchEmbedding
from scratchformer.models.pooling import masked_mean, pool
from scratchformer.core.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from scratchformer.models.pretrained import CheckpointError, SentenceEncoder, load_bert_encoder
from scratchformer.data.tokenization import TextTokenizer, TokenBatch
from scratchformer.core.transformer import Transformer, TransformerConfig

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
